/**
 * kerasmagic's JupyterLab plugin: a right-sidebar memory panel and a status-bar
 * item for the active notebook's kernel, fed by the `kerasmagic` comm.
 */
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { IMainMenu } from '@jupyterlab/mainmenu';
import { INotebookTracker } from '@jupyterlab/notebook';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';

import { MemoryModel } from './model';
import { MemoryPanel, MemoryStatus } from './widget';

const PANEL_ID = 'kerasmagic-memory';

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
  load: 'kerasmagic:load-extension'
};

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'kerasmagic:plugin',
  description: 'Kernel memory gauge for Keras/TensorFlow notebooks (kerasmagic).',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [IStatusBar, ICommandPalette, IMainMenu],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    statusBar: IStatusBar | null,
    palette: ICommandPalette | null,
    mainMenu: IMainMenu | null
  ) => {
    const model = new MemoryModel(tracker);
    const panel = new MemoryPanel(model);
    panel.id = PANEL_ID;
    panel.title.icon = memoryIcon;
    panel.title.caption = 'Kernel memory (kerasmagic)';
    app.shell.add(panel, 'right', { rank: 900 });

    app.commands.addCommand(CommandIDs.show, {
      label: 'Show Kernel Memory',
      caption: 'Open the kerasmagic memory panel for the active notebook’s kernel',
      execute: () => app.shell.activateById(PANEL_ID)
    });
    app.commands.addCommand(CommandIDs.free, {
      label: 'Free Kernel Memory',
      caption: 'Run kerasmagic’s cleanup in the kernel (never drops a model kept under a name)',
      isEnabled: () =>
        model.status === 'live' && model.free.phase !== 'queued' && model.free.phase !== 'running',
      execute: () => model.freeMemory()
    });
    app.commands.addCommand(CommandIDs.load, {
      label: 'Load kerasmagic',
      caption: 'Run %load_ext kerasmagic silently in the active notebook’s kernel',
      isEnabled: () => model.status === 'not-loaded',
      execute: () => model.loadExtension()
    });
    let enabledFor = '';
    model.changed.connect(() => {
      const now = `${model.status}/${model.free.phase}`;
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

    if (statusBar) {
      const item = new MemoryStatus(model, () => app.shell.activateById(PANEL_ID));
      statusBar.registerStatusItem('kerasmagic:status', {
        item,
        align: 'left',
        rank: 4,
        isActive: () => model.status === 'live' || model.status === 'not-loaded',
        activeStateChanged: model.changed
      });
    }
  }
};

export default plugin;
