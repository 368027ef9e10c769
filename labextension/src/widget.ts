/**
 * The views: the sidebar panel and the status-bar item. They only read the
 * model and call its actions; every figure on screen carries `data-km`
 * attributes with raw bytes so tests and users can read exact values.
 */
import { ISignal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { h } from './dom';
import { formatBytes, formatDelta, percent } from './format';
import { historyChart } from './chart';
import { backendLabel, oomFigures, oomSummary } from './oom';
import { droppedText } from './holders';
import { figureOf, leadOf, shortName } from './lead';
import { IFreeState, MemoryModel, tensorflow, tfBytes, tfCache } from './model';
import { NotebookModels } from './notebooks';
import { ICleanupReport, IGpuDevice, ISnapshot } from './protocol';
import { ScanSection } from './scanview';

/** A bar: this kernel's share, other processes, free; with an optional peak tick. */
function gauge(
  key: string,
  label: string,
  mine: number,
  others: number,
  total: number,
  note: string,
  peak: number | null = null,
  explain = ''
): HTMLElement {
  const bar = h(
    'div',
    { class: 'jp-kerasmagic-bar' },
    h('div', { class: 'jp-kerasmagic-fill-mine', style: `width:${percent(mine, total)}%` }),
    h('div', { class: 'jp-kerasmagic-fill-others', style: `width:${percent(others, total)}%` })
  );
  if (peak !== null && peak > mine) {
    bar.append(h('div', { class: 'jp-kerasmagic-peak', style: `left:${percent(peak, total)}%` }));
  }
  const value = `${formatBytes(mine)} of ${formatBytes(total)}`;
  bar.setAttribute('role', 'progressbar');
  bar.setAttribute('aria-label', explain ? `${label}: ${explain}` : label);
  bar.setAttribute('aria-valuemin', '0');
  bar.setAttribute('aria-valuemax', String(total));
  bar.setAttribute('aria-valuenow', String(Math.min(mine, total)));
  bar.setAttribute('aria-valuetext', `${value} (${note})`);
  const title = h('span', { class: 'jp-kerasmagic-gauge-title' }, label);
  if (explain) {
    title.title = explain;
    title.classList.add('jp-kerasmagic-term');
  }
  return h(
    'div',
    { class: 'jp-kerasmagic-gauge', 'data-km': key, 'data-bytes': String(mine) },
    h('div', { class: 'jp-kerasmagic-gauge-label' }, title, h('span', { class: 'jp-kerasmagic-value' }, value)),
    bar,
    h('div', { class: 'jp-kerasmagic-note' }, note)
  );
}

/** The peak figure shown: never below the current one (an older kernel may send a lower one). */
export function shownPeak(rss: number, peak: number | null): number | null {
  return peak === null ? null : Math.max(peak, rss);
}

function ramGauge(s: ISnapshot): HTMLElement {
  const used = s.ram.total_bytes - s.ram.available_bytes;
  const peak = shownPeak(s.ram.rss_bytes, s.ram.peak_rss_bytes);
  const note = (peak !== null ? `peak ${formatBytes(peak)} · ` : '') +
    `${formatBytes(s.ram.available_bytes)} of host RAM free`;
  const gaugeEl = gauge('rss', 'RAM', s.ram.rss_bytes, Math.max(0, used - s.ram.rss_bytes),
    s.ram.total_bytes, note, peak,
    'RSS (resident set size): the host RAM this kernel’s process holds; on a bar of the host’s ' +
    'RAM, other processes in grey');
  gaugeEl.dataset.peak = String(peak ?? '');
  return gaugeEl;
}

function gpuGauge(d: IGpuDevice): HTMLElement {
  const mine = d.process_used_bytes;
  const note = mine === null
    ? `all processes (this kernel's share unknown); ${formatBytes(d.total_bytes - d.used_bytes)} free`
    : `this kernel; all processes ${formatBytes(d.used_bytes)}; ${formatBytes(d.total_bytes - d.used_bytes)} free`;
  return gauge(`gpu-${d.cuda_index}`, `GPU ${d.cuda_index} · ${d.name}`, mine ?? d.used_bytes,
    mine === null ? 0 : Math.max(0, d.used_bytes - mine), d.total_bytes, note);
}

function tfLines(s: ISnapshot): HTMLElement {
  const tf = tensorflow(s);
  let text: string;
  if (tf === null) {
    text = 'TensorFlow not imported';
  } else if (tf.platform === null) {
    text = 'TensorFlow runtime not started (no GPU memory taken)';
  } else if (tf.devices.length === 0) {
    text = 'no allocator statistics on these devices';
  } else {
    // A figure known to miss tensors says so beside it (an older kernel sends no `uncounted`).
    text = tf.devices
      .map(
        d =>
          `${d.name}: ${formatBytes(d.in_use_bytes ?? 0)} in use, peak ${formatBytes(d.peak_bytes ?? 0)}` +
          (d.uncounted ? ` (${d.uncounted})` : '')
      )
      .join('; ');
  }
  const line = h(
    'div',
    { class: 'jp-kerasmagic-line', 'data-km': 'tf', 'data-bytes': String(tfBytes(s) ?? '') },
    h('b', {}, 'TensorFlow tensors '),
    text
  );
  line.title = "TensorFlow's allocator: the bytes of tensors it holds, exact (what runs out)";
  return line;
}

/** A count tile, or nothing when the kernel does not know the figure (no "–" placeholders). */
function fact(key: string, one: string, many: string, term: string, value: number | null): HTMLElement | null {
  if (value === null) {
    return null;
  }
  return h(
    'div',
    { class: 'jp-kerasmagic-fact', 'data-km': key, 'data-value': String(value) },
    h('span', { class: 'jp-kerasmagic-fact-value' }, String(value)),
    h('span', { class: 'jp-kerasmagic-fact-label jp-kerasmagic-term', title: term }, value === 1 ? one : many)
  );
}

/** Each tile: plain words first (for 1, for any other count), the technical term and what it
 * means in the tooltip. The models tile counts the live models named in the notebook: the
 * subset of every live model (Scan's count) that is cheap to count after each cell. */
export const TILES: Record<'models' | 'graphOps' | 'gradients' | 'functions', [string, string, string]> = {
  models: ['Keras model named in the notebook', 'Keras models named in the notebook',
    'Live Keras models named in the notebook: those your names, your objects (trainer.model), ' +
    'Out[] and callbacks hold, ' +
    'counted after every cell. Scan, below, lists every live model, those held elsewhere too ' +
    '(a closure, a module, a stored error), and what holds each.'],
  graphOps: ['TensorFlow graph operation', 'TensorFlow graph operations',
    'Default-graph ops: operations in TensorFlow’s default graph. It grows when graph-mode ' +
    '(tf.compat.v1) code builds ops again at every run, and each call gets slower.'],
  gradients: ['training graph kept', 'training graphs kept',
    'Custom gradients: entries in TensorFlow’s gradient registry. Each model’s first fit() adds ' +
    'one that keeps its traced training graph alive; Free memory purges those of dropped models.'],
  functions: ['compiled TF function', 'compiled TF functions',
    'Traced tf.functions: Python functions TensorFlow has traced into graphs, each trace kept. ' +
    'Counted on opening and after Free memory, not after every cell.']
};

/** A finished cleanup in words: what it dropped, or, when it dropped nothing, what it freed. */
export function cleanupText(report: ICleanupReport, rssBefore: number | null, rssAfter: number | null): string {
  const rss = rssBefore !== null && rssAfter !== null
    ? ` (RSS ${formatBytes(rssBefore)} → ${formatBytes(rssAfter)})` : '';
  const ram = report.freed_bytes > 0 ? formatBytes(report.freed_bytes) : '';
  const tensorsFreed = report.allocator_freed_bytes ?? 0;
  const tensors = tensorsFreed > 0
    ? `${formatBytes(tensorsFreed)} of ${backendLabel(report.allocator_backend ?? '')} tensors` : '';
  const released = report.released ?? [];
  const graphs = released.length ? `; ${released.join('; ')}` : '';
  const dropped = droppedText(report.dropped);
  let text: string;
  if (dropped.length) {
    const freed = [ram, tensors].filter(Boolean).join(' and ');
    text = (freed ? `Freed ${freed}${rss}` : `RSS did not fall${rss}`) + `: dropped ${dropped.join(', ')}${graphs}.`;
  } else if (ram || tensors) {
    text = 'No model to drop; ' + [ram ? `returned ${ram} of freed memory to the OS${rss}` : '',
      tensors ? `freed ${tensors}` : ''].filter(Boolean).join(' and ') + `${graphs}.`;
  } else {
    text = `Nothing to free: no model to drop${rss}${graphs}.`;
  }
  return text + (report.not_freed.length ? ` Not freed: ${report.not_freed.join(', ')}.` : '') +
    (report.kept.length ? ` Still alive under a name: ${report.kept.join(', ')}.` : '');
}

function freeText(free: IFreeState): string {
  switch (free.phase) {
    case 'idle':
      return '';
    case 'queued':
      return 'Queued: runs when the current cell finishes…';
    case 'running':
      return 'Freeing memory…';
    case 'failed':
      return `Free memory failed: ${free.summary}.`;
    case 'done':
      return free.report === null ? free.summary : cleanupText(free.report, free.rssBeforeBytes, free.rssAfterBytes);
  }
}

/** The leak warning, changed once "Free memory" ran after it; a polite live region. */
function leakBanner(m: MemoryModel): HTMLElement {
  const verdict = m.verdict;
  if (!verdict?.growing) {
    return h('div', { class: 'jp-kerasmagic-note', 'data-km': 'no-leak', role: 'status' },
      m.live ? 'No growth across re-runs detected.' : 'Live monitor off: figures update after each cell.');
  }
  if (verdict.freed_since) {
    return h('div', { class: 'jp-kerasmagic-leak jp-mod-freed', 'data-km': 'leak', 'data-freed': 'true', role: 'status' },
      h('b', {}, 'Memory was freed since this warning. '), `Before: ${verdict.message}`);
  }
  return h('div', { class: 'jp-kerasmagic-leak', 'data-km': 'leak', role: 'alert' },
    h('b', {}, '⚠ Memory keeps growing. '), verdict.message);
}

/** The kernel's latest out-of-memory error, its figures and its remedy; dismissable. */
function oomBanner(m: MemoryModel): HTMLElement | null {
  const last = m.lastOom;
  if (last === null) {
    return null;
  }
  const o = last.oom;
  const figures = oomFigures(o);
  const dismiss = h('button', {
    class: 'jp-mod-styled jp-kerasmagic-oom-dismiss',
    'data-km': 'oom-dismiss',
    'aria-label': `Dismiss the out-of-memory note of cell [${last.execution_count}]`
  }, 'Dismiss') as HTMLButtonElement;
  dismiss.addEventListener('click', () => m.dismissOom());
  const summary = oomSummary(o);
  return h(
    'div',
    {
      class: 'jp-kerasmagic-oom' + (last.freedSince ? ' jp-mod-freed' : ''),
      'data-km': 'oom',
      'data-execution-count': String(last.execution_count),
      'data-wanted': String(o.wanted_bytes ?? ''),
      'data-device': o.device ?? '',
      'data-freed': String(last.freedSince),
      role: 'status'
    },
    h('b', {}, `✖ Cell [${last.execution_count}] ran ${summary} `),
    `(${backendLabel(o.backend)})` + (o.isolated ? '; that process has ended, and its memory with it.' : '.'),
    figures ? h('div', { class: 'jp-kerasmagic-note', 'data-km': 'oom-figures' }, `Allocator: ${figures}`) : null,
    h('div', { class: 'jp-kerasmagic-oom-remedy', 'data-km': 'oom-remedy' }, h('b', {}, 'Remedy: '), o.remedy),
    last.freedSince ? h('div', { class: 'jp-kerasmagic-note' }, 'Memory was freed since.') : null,
    dismiss
  );
}

/**
 * The one figure a user wants first, in large type: what runs out first against its limit
 * (the backend's tensors where it keeps figures beside a GPU; else VRAM; else RSS), with
 * NVML's reservation beside it, named as such (`kerasmagic/snapshot.py`).
 */
function headline(m: MemoryModel, s: ISnapshot): HTMLElement {
  const lead = leadOf(s);
  const last = m.history[m.history.length - 1];
  const before = last === undefined ? null : figureOf(last.start, lead.what);
  const after = last === undefined ? null : figureOf(last.end, lead.what);
  const change = before === null || after === null ? null : after - before;
  const of = lead.limit_bytes === null ? '' : ` of ${formatBytes(lead.limit_bytes)}`;
  const reserved = lead.reserved_bytes === null ? null
    : h('div', { class: 'jp-kerasmagic-note', 'data-km': 'headline-reserved' },
      `${formatBytes(lead.reserved_bytes)} reserved on the GPU (NVML: what the process holds, ` +
      'flat once TensorFlow has reserved the card)');
  return h(
    'div',
    { class: 'jp-kerasmagic-headline', 'data-km': 'headline', 'data-bytes': String(lead.used_bytes),
      'data-what': lead.what, 'data-limit': String(lead.limit_bytes ?? '') },
    h('div', { class: 'jp-kerasmagic-headline-value' }, formatBytes(lead.used_bytes) + of),
    h('div', { class: 'jp-kerasmagic-headline-label' },
      lead.label + (change === null ? '' : ` · ${formatDelta(change)} in cell [${last.execution_count}]`)),
    reserved
  );
}

/** Whether the leak detector says memory grows (and nothing was freed since). */
export function growing(m: MemoryModel | null): boolean {
  return m !== null && m.status === 'live' && !!m.verdict?.growing && !m.verdict.freed_since;
}

const MESSAGES: { [status: string]: string } = {
  'no-notebook': 'Open a notebook to see its kernel’s memory.',
  'no-kernel': 'This notebook has no running kernel.',
  connecting: 'Connecting to the kernel…',
  'not-loaded': 'kerasmagic is not loaded in this kernel, so there is nothing to measure.'
};

/** The sidebar panel. */
export class MemoryPanel extends Widget {
  constructor(models: NotebookModels) {
    super();
    this._models = models;
    this.addClass('jp-kerasmagic-panel');
    this._loadButton = h('button', { class: 'jp-mod-styled jp-mod-accept', 'data-km': 'load' },
      'Load kerasmagic') as HTMLButtonElement;
    this._loadButton.addEventListener('click', () => void this._models.current?.loadExtension());
    this._freeButton = h('button', { class: 'jp-mod-styled jp-kerasmagic-free', 'data-km': 'free' },
      'Free memory') as HTMLButtonElement;
    this._freeButton.title =
      'Run kerasmagic.reset() in the kernel: drop models held only by Out[], tracebacks and ' +
      'callbacks, reset Keras/TF state, collect. Never drops a model you keep under a name.';
    this._freeButton.addEventListener('click', () => void this._models.current?.freeMemory());
    this._scan = new ScanSection(() => void this._models.current?.scanMemory());
    this.node.append(
      this._header,
      h('div', { class: 'jp-kerasmagic-message' }, this._message, this._loadButton),
      this._body,
      h('div', { class: 'jp-kerasmagic-actions' }, this._freeButton, this._freeResult),
      this._scan.node
    );
    models.changed.connect(this._render, this);
    this._render();
  }

  private _render(): void {
    const m = this._models.current;
    if (m === null) {
      this._renderEmpty();
      return;
    }
    const s = m.snapshot;
    this.node.dataset.status = m.status;
    this._header.replaceChildren(
      h('div', { class: 'jp-kerasmagic-title' }, 'Kernel memory'),
      h('div', { class: 'jp-kerasmagic-subtitle', 'data-km': 'kernel', 'data-pid': s ? String(s.pid) : '' },
        [m.notebookPath || 'no notebook', m.kernelName, s ? `pid ${s.pid}` : '',
          m.kernelStatus ?? '', m.kerasmagicVersion ? `kerasmagic ${m.kerasmagicVersion}` : '']
          .filter(Boolean).join(' · '))
    );
    const message = m.status === 'live' ? '' : MESSAGES[m.status];
    this._message.textContent = [message, m.error].filter(Boolean).join(' ');
    this._message.parentElement!.hidden = !message && !m.error;
    this._loadButton.hidden = m.status !== 'not-loaded';
    this._freeButton.disabled = m.status !== 'live' || m.free.phase === 'queued' || m.free.phase === 'running';
    this._freeButton.hidden = m.status !== 'live';
    this._freeResult.textContent = freeText(m.free);
    this._freeResult.dataset.phase = m.free.phase;
    this._freeResult.dataset.freedBytes = String(m.free.report?.freed_bytes ?? '');
    this._scan.render(m);
    if (s === null || m.status !== 'live') {
      this._body.replaceChildren();
      return;
    }
    const gpus = s.gpu.devices;
    const oom = oomBanner(m);
    this._body.replaceChildren(
      headline(m, s),
      ...(oom ? [oom] : []),
      ramGauge(s),
      ...(gpus.length ? gpus.map(gpuGauge)
        : [h('div', { class: 'jp-kerasmagic-line', 'data-km': 'gpu' }, h('b', {}, 'GPU '), s.gpu.message ?? s.gpu.status)]),
      tfLines(s),
      h('div', { class: 'jp-kerasmagic-facts' },
        fact('live-models', ...TILES.models, s.keras.live_models),
        fact('graph-ops', ...TILES.graphOps, tfCache(s, 'default_graph_ops')),
        fact('custom-gradients', ...TILES.gradients, tfCache(s, 'custom_gradients')),
        fact('functions', ...TILES.functions, m.functions)),
      historyChart(m.history, m.running, leadOf(s).what),
      leakBanner(m)
    );
  }

  private _renderEmpty(): void {
    this.node.dataset.status = 'no-notebook';
    this._header.replaceChildren(h('div', { class: 'jp-kerasmagic-title' }, 'Kernel memory'));
    this._message.textContent = MESSAGES['no-notebook'];
    this._message.parentElement!.hidden = false;
    this._loadButton.hidden = true;
    this._freeButton.hidden = true;
    this._freeResult.textContent = '';
    this._scan.render(null);
    this._body.replaceChildren();
  }

  private _models: NotebookModels;
  private _header = h('div', { class: 'jp-kerasmagic-header' });
  private _message = h('span', {});
  private _body = h('div', { class: 'jp-kerasmagic-body' });
  private _loadButton: HTMLButtonElement;
  private _freeButton: HTMLButtonElement;
  private _scan: ScanSection;
  private _freeResult = h('div', {
    class: 'jp-kerasmagic-free-result',
    'data-km': 'free-result',
    role: 'status',
    'aria-live': 'polite'
  });
}

/** What a status item shows: a model (the active notebook's, or one notebook's own). */
export interface IModelSource {
  readonly current: MemoryModel | null;
  readonly changed: ISignal<unknown, void>;
}

/** One notebook's model as a source (Notebook 7's toolbar item follows its own notebook). */
export function single(model: MemoryModel): IModelSource {
  return { current: model, changed: model.changed };
}

/** The status item: the headline's figure (`snapshot.py`); in Notebook 7, each toolbar's. */
export class MemoryStatus extends Widget {
  constructor(models: IModelSource, onClick: () => void) {
    super();
    this._models = models;
    this.addClass('jp-kerasmagic-status');
    this.node.dataset.km = 'status';
    this.node.title = 'Kernel memory (kerasmagic): click for details';
    this.node.setAttribute('role', 'button');
    this.node.tabIndex = 0;
    this.node.addEventListener('click', onClick);
    this.node.addEventListener('keydown', event => {
      if (event.key === 'Enter' || event.key === ' ') {
        event.preventDefault();
        onClick();
      }
    });
    models.changed.connect(this._render, this);
    this._render();
  }

  private _render(): void {
    const m = this._models.current;
    const s = m?.status === 'live' ? m.snapshot : null;
    const warn = growing(m);
    this.toggleClass('jp-mod-warn', warn);
    this.node.dataset.warn = String(warn);
    if (s === null) {
      this.node.textContent = m?.status === 'not-loaded' ? 'Mem: –' : '';
      this.node.dataset.bytes = '';
      return;
    }
    const lead = leadOf(s);
    const [label, bytes] = [shortName(lead), lead.used_bytes];
    this.node.textContent = `${warn ? '⚠ ' : ''}${label} ${formatBytes(bytes)}`;
    this.node.title = warn
      ? `Memory keeps growing: ${m!.verdict!.message} Click for details.`
      : 'Kernel memory (kerasmagic): click for details';
    this.node.setAttribute('aria-label', `Kernel ${label} ${formatBytes(bytes)}` +
      (warn ? ', memory keeps growing' : '') + ': open the memory panel');
    this.node.dataset.bytes = String(bytes);
  }

  private _models: IModelSource;
}
