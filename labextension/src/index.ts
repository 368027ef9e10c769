/**
 * kerasmagic's JupyterLab plugin: a right-sidebar memory panel and a status-bar
 * item for the active notebook's kernel, and a memory badge and metadata record
 * under every executed cell, all fed by each notebook's `kerasmagic` comm.
 */
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { IMainMenu } from '@jupyterlab/mainmenu';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';

import { BadgeSettings, CellBadges } from './badges';
import { CellRecorder } from './cellrecord';
import { MemoryModel } from './model';
import { NotebookModels } from './notebooks';
import { ReportLines } from './reportlines';
import { MemoryPanel, MemoryStatus, single } from './widget';

const PANEL_ID = 'kerasmagic-memory';
const OPENED_ONCE = 'kerasmagic:sidebar-opened-once';

const memoryIcon = new LabIcon({
  name: 'kerasmagic:memory',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">' +
    '<g class="jp-icon3" fill="#616161"><path d="M4 7h16v10H4zM6 9v6h2V9zm4 0v6h2V9zm4 0v6h2V9z' +
    'M5 17h2v3H5zm4 0h2v3H9zm4 0h2v3h-2zm4 0h2v3h-2zM5 4h2v3H5zm4 0h2v3H9zm4 0h2v3h-2zm4 0h2v3h-2z"/></g></svg>'
});

const CommandIDs = {
  show: 'kerasmagic:show-memory',
  free: 'kerasmagic:free-memory',
  load: 'kerasmagic:load-extension',
  badges: 'kerasmagic:toggle-cell-badges'
};

const PLUGIN_ID = 'kerasmagic:plugin';

/**
 * Follow the `showCellBadges` setting (schema/plugin.json); badges stay on without a registry.
 * Resolve with a function that saves a new value (or just applies it without a registry).
 */
async function followSettings(
  registry: ISettingRegistry | null,
  badges: BadgeSettings
): Promise<(show: boolean) => Promise<void>> {
  const apply = async (show: boolean): Promise<void> => {
    badges.show = show;
  };
  if (!registry) {
    return apply;
  }
  try {
    const settings = await registry.load(PLUGIN_ID);
    const read = (): void => {
      badges.show = settings.get('showCellBadges').composite !== false;
    };
    settings.changed.connect(read);
    read();
    return show => settings.set('showCellBadges', show);
  } catch (reason) {
    console.warn('kerasmagic: settings not loaded, badges stay on', reason);
    return apply;
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'Kernel memory gauge for Keras/TensorFlow notebooks (kerasmagic).',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [IStatusBar, ICommandPalette, IMainMenu, ISettingRegistry],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    statusBar: IStatusBar | null,
    palette: ICommandPalette | null,
    mainMenu: IMainMenu | null,
    registry: ISettingRegistry | null
  ) => {
    const models = new NotebookModels(tracker);
    const badgeSettings = new BadgeSettings();
    const saveShowBadges = followSettings(registry, badgeSettings);
    app.commands.addCommand(CommandIDs.badges, {
      label: 'Show Memory Badges Under Cells',
      caption: 'Show kerasmagic’s per-cell memory record under each executed cell',
      isToggled: () => badgeSettings.show,
      execute: async () => (await saveShowBadges)(!badgeSettings.show)
    });
    badgeSettings.changed.connect(() => app.commands.notifyCommandChanged(CommandIDs.badges));
    palette?.addItem({ command: CommandIDs.badges, category: 'Notebook Operations' });
    mainMenu?.viewMenu.addGroup([{ command: CommandIDs.badges }], 60);
    const attach = (panel: NotebookPanel, model: MemoryModel): void => {
      const recorder = new CellRecorder(panel, model);
      const badges = new CellBadges(panel, badgeSettings);
      const reports = new ReportLines(panel);
      panel.disposed.connect(() => {
        recorder.dispose();
        badges.dispose();
        reports.dispose();
      });
    };
    models.forEach(attach);
    models.added.connect((_, { panel, model }) => attach(panel, model));
    const panel = new MemoryPanel(models);
    panel.id = PANEL_ID;
    panel.title.icon = memoryIcon;
    panel.title.caption = 'Kernel memory (kerasmagic)';
    app.shell.add(panel, 'right', { rank: 900 });
    // Open on the right once, the first time kerasmagic runs in this browser (after the
    // layout is restored, which would collapse it; later the user's own layout stays). In
    // Notebook 7 a notebook opens full width, and its toolbar item (below) is the way in.
    const lab = app.name === 'JupyterLab';
    if (lab) {
      void app.restored.then(() => {
        if (window.localStorage.getItem(OPENED_ONCE) === null) {
          window.localStorage.setItem(OPENED_ONCE, 'yes');
          app.shell.activateById(PANEL_ID);
        }
      });
    }

    app.commands.addCommand(CommandIDs.show, {
      label: 'Show Kernel Memory',
      caption: 'Open the kerasmagic memory panel for the active notebook’s kernel',
      execute: () => app.shell.activateById(PANEL_ID)
    });
    app.commands.addCommand(CommandIDs.free, {
      label: 'Free Kernel Memory',
      caption: 'Run kerasmagic’s cleanup in the kernel (never drops a model kept under a name)',
      isEnabled: () => {
        const model = models.current;
        return model?.status === 'live' && model.free.phase !== 'queued' && model.free.phase !== 'running';
      },
      execute: () => models.current?.freeMemory()
    });
    app.commands.addCommand(CommandIDs.load, {
      label: 'Load kerasmagic',
      caption: 'Run %load_ext kerasmagic silently in the active notebook’s kernel',
      isEnabled: () => models.current?.status === 'not-loaded',
      execute: () => models.current?.loadExtension()
    });
    let enabledFor = '';
    models.changed.connect(() => {
      const model = models.current;
      const now = `${model?.status}/${model?.free.phase}`;
      if (now !== enabledFor) {
        enabledFor = now;
        app.commands.notifyCommandChanged(CommandIDs.free);
        app.commands.notifyCommandChanged(CommandIDs.load);
      }
    });
    const commands = [CommandIDs.show, CommandIDs.free, CommandIDs.load];
    for (const command of commands) {
      palette?.addItem({ command, category: 'Kernel' });
    }
    mainMenu?.kernelMenu.addGroup(commands.map(command => ({ command })), 90);

    const open = (): void => app.shell.activateById(PANEL_ID);
    if (!statusBar || !lab) {
      // No status bar (Notebook 7): the figure, in each notebook's toolbar, opens the panel.
      const toolbarItem = (notebook: NotebookPanel, model: MemoryModel): void => {
        notebook.toolbar.insertItem(10, 'kerasmagic-memory', new MemoryStatus(single(model), open));
      };
      models.forEach(toolbarItem);
      models.added.connect((_, { panel: notebook, model }) => toolbarItem(notebook, model));
    }
    if (statusBar) {
      const item = new MemoryStatus(models, open);
      statusBar.registerStatusItem('kerasmagic:status', {
        item,
        align: 'left',
        rank: 4,
        isActive: () => models.current?.status === 'live' || models.current?.status === 'not-loaded',
        activeStateChanged: models.changed
      });
    }
  }
};

export default plugin;
