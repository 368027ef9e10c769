/**
 * The sidebar's "What holds memory" section: a Scan button, then a table of
 * every live Keras model (its size, what holds it and what frees it, whether
 * "Free memory" would) and one of the largest data, which is the user's and
 * never freed. Reads the model's scan state only; rows carry `data-km`.
 */
import { h } from './dom';
import { formatBytes } from './format';
import { holderLines, isGroup, modelDistinctions } from './holders';
import { MemoryModel } from './model';
import { ILiveModel, IVariable } from './protocol';
import { IScanState } from './scan';

/** A table with a caption and column headers (`scope="col"`), one `<tr>` per row. */
function table(key: string, caption: string, columns: string[], rows: HTMLElement[]): HTMLElement {
  return h(
    'table',
    { class: 'jp-kerasmagic-table', 'data-km': key },
    h('caption', {}, caption),
    h('thead', {}, h('tr', {}, ...columns.map(c => h('th', { scope: 'col' }, c)))),
    h('tbody', {}, ...rows)
  );
}

/**
 * The models' table. Each row is laid out as a block (the model, then what holds it, under it)
 * to read at the sidebar's width, so every part states its table role: CSS `display` must not
 * take the table's meaning away from screen readers.
 */
function modelTable(rows: HTMLElement[]): HTMLElement {
  const el = table('scan-models', 'Live Keras models', ['Model', 'Held by → what frees it'], rows);
  el.setAttribute('role', 'table');
  for (const [selector, role] of [['thead, tbody', 'rowgroup'], ['tr', 'row'], ['th[scope="col"]', 'columnheader'],
    ['th[scope="row"]', 'rowheader'], ['td', 'cell']]) {
    el.querySelectorAll(selector).forEach(node => node.setAttribute('role', role));
  }
  return el;
}

/** A figure and its unit that never break apart (`72 B weights`). */
function figure(text: string): HTMLElement {
  return h('span', { class: 'jp-kerasmagic-nowrap' }, text);
}

/** Holders that share a remedy, as one line each: `Out[7], _, _7 → Free memory clears it`. */
function holderList(m: ILiveModel): HTMLElement {
  const items = holderLines(m.holders, m.remedies).map(line => {
    // The kernel's names in code type; words that stand for several names in plain type.
    const names = line.items.flatMap((holder, i) => [i ? ', ' : '',
      isGroup(holder) ? holder.shown : h('code', {}, holder.shown)]);
    const item = h('li', {}, ...names, line.remedy ? ` → ${line.remedy}` : '');
    const groups = line.items.filter(isGroup);
    if (groups.length) {
      item.title = groups.map(g => `${g.shown}: ${g.exact.join('; ')}`).join('\n');
    }
    return item;
  });
  return h('ul', { class: 'jp-kerasmagic-holders' }, ...items);
}

/** One model: name (told apart from another of the same name), class and sizes, the "Free
 * memory" mark; then its holders and remedies. */
function modelRow(m: ILiveModel, distinction: string): HTMLElement {
  const estimate = m.estimate_bytes !== null && m.estimate_bytes > 0
    ? h('div', { class: 'jp-kerasmagic-estimate', title: `${m.traced_ops ?? '?'} ops in its traced graphs` },
      '≈ ', figure(formatBytes(m.estimate_bytes)), ' traced graphs (estimate)')
    : null;
  const mark = m.freeable
    ? h('div', { class: 'jp-kerasmagic-freeable' }, '✓ freed by Free memory')
    : h('div', {}, 'not freed by Free memory');
  const which = distinction ? h('span', { class: 'jp-kerasmagic-model-which' }, ` (${distinction})`) : null;
  return h(
    'tr',
    { 'data-km': 'scan-model', 'data-name': m.name, 'data-label': m.name + (distinction ? ` (${distinction})` : ''),
      'data-bytes': String(m.size_bytes), 'data-freeable': String(m.freeable) },
    h('th', { scope: 'row' },
      h('div', { class: 'jp-kerasmagic-model-name' }, m.name, which),
      h('div', { class: 'jp-kerasmagic-model-size' }, `${m.type} · `, figure(`${formatBytes(m.size_bytes)} weights`)),
      estimate,
      mark),
    h('td', {}, holderList(m))
  );
}

function variableRow(v: IVariable): HTMLElement {
  return h(
    'tr',
    { 'data-km': 'scan-variable', 'data-name': v.name, 'data-bytes': String(v.size_bytes) },
    h('th', { scope: 'row' }, h('code', {}, v.name)),
    h('td', {}, v.type),
    h('td', {}, figure(formatBytes(v.size_bytes)))
  );
}

function emptyRow(columns: number, text: string): HTMLElement {
  return h('tr', {}, h('td', { colspan: String(columns), class: 'jp-kerasmagic-note' }, text));
}

function statusText(s: IScanState): string {
  const at = s.atMs === null ? '' : new Date(s.atMs).toLocaleTimeString();
  switch (s.phase) {
    case 'idle':
      return 'Lists each live Keras model, what holds it and what frees it, and your largest data.';
    case 'queued':
      return 'Queued: scans when the current cell finishes…';
    case 'running':
      return 'Scanning…';
    case 'failed':
      return `Scan failed: ${s.error}.` + (at ? ` The rows below are from ${at}.` : '');
    case 'done': {
      // Live models as the kernel defines them (walk/deep.py); the model state no model owns,
      // listed with them, is not counted as one (an older kernel sends no `kind`).
      const count = s.models.filter(m => (m.kind ?? 'model') === 'model').length;
      const loose = s.models.length - count;
      const freeable = s.models.filter(m => m.freeable).length;
      const named = s.namedModels === null ? '' : ` (${s.namedModels} named in the notebook)`;
      const models = `${count} live model${count === 1 ? '' : 's'}${named}` +
        (loose ? `, ${loose} piece${loose === 1 ? '' : 's'} of model state no model owns` : '');
      return `${models}; Free memory would free ${freeable} of them; ${s.variables.length} large ` +
        `variable${s.variables.length === 1 ? '' : 's'}; scanned at ${at}.` +
        (s.stale ? ' Memory changed since: scan again for current figures.' : '');
    }
  }
}

/** The collapsible section; `render` is cheap when nothing changed (no live-region churn). */
export class ScanSection {
  constructor(onScan: () => void) {
    this.button.addEventListener('click', onScan);
    this.node.open = true;
    this.node.append(
      h('summary', { class: 'jp-kerasmagic-scan-summary' }, 'What holds memory'),
      h('div', { class: 'jp-kerasmagic-scan-bar' }, this.button, this._status),
      this._tables
    );
  }

  readonly node = h('details', { class: 'jp-kerasmagic-scan', 'data-km': 'scan-section' }) as HTMLDetailsElement;
  readonly button = h('button', {
    class: 'jp-mod-styled jp-kerasmagic-scan-button',
    'data-km': 'scan',
    'aria-label': 'Scan the kernel for what holds memory',
    title: 'Walks the kernel’s objects between cells (tens to hundreds of ms); changes nothing.'
  }, 'Scan') as HTMLButtonElement;

  render(m: MemoryModel | null): void {
    const live = m !== null && m.status === 'live';
    this.node.hidden = !live;
    if (!live) {
      return;
    }
    const s = m.scan;
    this.button.disabled = s.phase === 'queued' || s.phase === 'running';
    if (s === this._shown) {
      return;
    }
    this._shown = s;
    this._status.textContent = statusText(s);
    this._status.dataset.phase = s.phase;
    this._status.dataset.stale = String(s.stale);
    if (s.atMs === null) {
      this._tables.replaceChildren();
      return;
    }
    const distinctions = modelDistinctions(s.models);
    this._tables.replaceChildren(
      modelTable(s.models.length ? s.models.map((m, i) => modelRow(m, distinctions[i]))
        : [emptyRow(2, 'No live Keras model.')]),
      table('scan-variables', 'Largest data (yours; never freed)', ['Name', 'Type', 'Size'],
        s.variables.length ? s.variables.map(variableRow)
          : [emptyRow(3, 'No array, DataFrame or tensor in the namespace.')])
    );
  }

  private _shown: IScanState | null = null;
  private _status = h('div', {
    class: 'jp-kerasmagic-note',
    'data-km': 'scan-status',
    role: 'status',
    'aria-live': 'polite'
  });
  private _tables = h('div', { class: 'jp-kerasmagic-scan-tables' });
}
