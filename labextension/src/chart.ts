/**
 * The sidebar's history chart: each recent cell's change drawn from its start to
 * its end figure on an axis scaled to the data, its in-cell peak as a tick, the
 * running cell's samples as a live line, labelled axis values and a legend.
 * Pure SVG; colours come from the stylesheet (theme variables only).
 */
import { formatBytes, formatDelta } from './format';
import { LeadKind, figureOf } from './lead';
import { ILivePoint } from './model';
import { ICellRecord } from './protocol';

const SVG = 'http://www.w3.org/2000/svg';
export const CHART_CELLS = 20;
// 240 units across a ~230 px sidebar chart: the 11-unit text reads at ~10.5 px (280 gave ~7 px).
const W = 240;
const H = 122;
const LEFT = 52; // axis labels
const RIGHT = 6;
const TOP = 16; // room for the delta labels
const BOTTOM = 102; // x-axis labels below
const LIVE_SLOTS = 3; // the running cell's column is this many cells wide
const MIN_COLUMNS = 10; // a few cells get wide bars, not a crowd of thin ones
const MB = 2 ** 20;

function svg(tag: string, attrs: { [key: string]: string | number }, text?: string): SVGElement {
  const el = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) {
    el.setAttribute(key, String(value));
  }
  if (text !== undefined) {
    el.textContent = text;
  }
  return el;
}

function h(tag: string, cls: string, ...children: (Node | string)[]): HTMLElement {
  const el = document.createElement(tag);
  el.className = cls;
  el.append(...children);
  return el;
}

/** The figures of one cell the chart draws. */
interface IBar {
  count: number;
  start: number;
  end: number;
  peak: number;
  duration: number;
}

/** Each cell's start and end figure of the headline's kind, and its in-cell peak where kept. */
function bars(cells: ReadonlyArray<ICellRecord>, what: LeadKind): IBar[] {
  const peakOf = (c: ICellRecord): number | null =>
    what === 'rss' ? c.peak_rss_bytes : what === 'vram' ? c.peak_gpu_bytes : null;
  return cells.map(c => {
    const start = figureOf(c.start, what) ?? 0;
    const end = figureOf(c.end, what) ?? 0;
    const peak = Math.max(start, end, peakOf(c) ?? 0);
    return { count: c.execution_count, start, end, peak, duration: c.duration_s };
  });
}

const TITLES: { [K in LeadKind]: string } = {
  allocator: 'Tensors in use',
  vram: 'VRAM',
  rss: 'RSS'
};

const JUMP_FLOOR = 16 * MB; // a change below this is never clipped away
const JUMP_RATIO = 3; // a jump is this many times larger than everything after it spans
const MIN_AFTER = 2; // cells after a jump needed to scale to them

/**
 * Return the index of the first bar the axis is scaled to: the one after the most recent jump
 * (the import cell's +535 MB before re-runs of a few MB), else 0. A bar is a jump when its
 * change is at least 16 MB and three times the span of everything after it (at least two
 * cells, and the live line), so the re-runs the user watches fill the chart; the newest cells
 * are always in scale.
 */
export function scaleFrom(shown: ReadonlyArray<IBar>, live: ReadonlyArray<number>): number {
  let lo = Math.min(...live);
  let hi = Math.max(...live);
  for (let i = shown.length - 1; i >= 0; i--) {
    const b = shown[i];
    const change = Math.abs(b.end - b.start);
    const after = shown.length - 1 - i;
    lo = Math.min(lo, b.end);
    hi = Math.max(hi, b.end);
    if (after >= MIN_AFTER && change >= JUMP_FLOOR && change > JUMP_RATIO * (hi - lo)) {
      return i + 1;
    }
    lo = Math.min(lo, b.start, b.peak);
    hi = Math.max(hi, b.start, b.peak);
  }
  return 0;
}

/** Return a "nice" [lo, hi] around the values: at least 4 MB wide, padded by a tenth. */
export function axisRange(values: number[]): [number, number] {
  let lo = Math.min(...values);
  let hi = Math.max(...values);
  const pad = Math.max((hi - lo) * 0.1, 2 * MB);
  lo = Math.max(0, Math.floor((lo - pad) / MB) * MB);
  hi = Math.ceil((hi + pad) / MB) * MB;
  return [lo, hi];
}

function mbLabel(n: number): string {
  return n >= 10 * 1024 * MB ? formatBytes(n) : `${Math.round(n / MB)} MB`;
}

const LABEL_GAP = 42; // a "+48 MB" label's width at the chart's font size
const CHAR_W = 6.7; // a digit's width at the chart's 11-unit font, for keeping labels in the plot

/**
 * Label the changes worth a label, skipping any that would overlap a label already placed:
 * first the jumps the axis cuts (their size is only in the label), then, biggest first, the
 * changes in scale of at least 1 MB and a quarter of the largest of them.
 */
function labelled(shown: IBar[], step: number, from: number, cut: (b: IBar) => boolean): Set<number> {
  const big = (b: IBar): number => Math.abs(b.end - b.start);
  const largest = Math.max(0, ...shown.slice(from).map(big));
  const bySize = (a: number, b: number): number => big(shown[b]) - big(shown[a]);
  const indices = shown.map((_, i) => i);
  const jumps = indices.filter(i => cut(shown[i]) && big(shown[i]) >= JUMP_FLOOR).sort(bySize);
  const changes = indices.filter(i => i >= from && !cut(shown[i]) && big(shown[i]) >= Math.max(MB, largest / 4))
    .sort(bySize);
  const out = new Set<number>();
  for (const i of [...jumps, ...changes]) {
    if ([...out].every(j => Math.abs(i - j) * step >= LABEL_GAP)) {
      out.add(i);
    }
  }
  return out;
}

/** The chart with its title and legend; `data-lo`/`data-hi` carry the axis range in bytes. */
export function historyChart(
  cells: ReadonlyArray<ICellRecord>,
  live: ReadonlyArray<ILivePoint>,
  kind: LeadKind
): HTMLElement {
  const shown = bars(cells.slice(-CHART_CELLS), kind);
  const livePts = live
    .map(p => ({
      t: p.time_s,
      v: p.lead === kind ? p.lead_bytes : kind === 'rss' ? p.rss_bytes : kind === 'vram' ? p.gpu_bytes : null
    }))
    .filter((p): p is { t: number; v: number } => p.v !== null);
  const what = TITLES[kind];
  const box = h('div', 'jp-kerasmagic-history');
  box.dataset.km = 'history';
  box.dataset.cells = String(cells.length);
  if (!shown.length && !livePts.length) {
    box.append(h('div', 'jp-kerasmagic-section-title', what),
      h('div', 'jp-kerasmagic-note', 'No cells recorded yet.'));
    return box;
  }
  const from = scaleFrom(shown, livePts.map(p => p.v));
  const inScale = shown.slice(from);
  const values = [...inScale.flatMap(b => [b.start, b.end, b.peak]), ...livePts.map(p => p.v)];
  if (from > 0) {
    values.push(shown[from - 1].end); // the level the jump reached: where the re-runs start
  }
  const [lo, hi] = axisRange(values);
  const y = (v: number): number => BOTTOM - ((v - lo) / (hi - lo)) * (BOTTOM - TOP);
  const clip = (v: number): number => Math.max(TOP, Math.min(BOTTOM, y(v)));
  const columns = Math.max(shown.length, MIN_COLUMNS);
  const slots = columns + (livePts.length ? LIVE_SLOTS : 0);
  const step = (W - LEFT - RIGHT) / slots;
  const chart = svg('svg', { viewBox: `0 0 ${W} ${H}`, class: 'jp-kerasmagic-chart', role: 'img' });
  chart.dataset.lo = String(lo);
  chart.dataset.hi = String(hi);
  for (const [v, cls] of [[hi, 'top'], [lo, 'bottom']] as [number, string][]) {
    chart.append(svg('line', { x1: LEFT, x2: W - RIGHT, y1: y(v), y2: y(v), class: 'jp-kerasmagic-grid' }));
    chart.append(svg('text', { x: LEFT - 4, y: y(v) + 3, 'text-anchor': 'end', class: `jp-kerasmagic-axis jp-mod-${cls}` }, mbLabel(v)));
  }
  const isCut = (b: IBar): boolean => Math.max(b.start, b.end) > hi || Math.min(b.start, b.end) < lo;
  const marks = labelled(shown, step, from, isCut);
  const labels: SVGElement[] = []; // drawn after every bar: no later bar covers one
  let clipped = 0;
  shown.forEach((b, i) => {
    const x = LEFT + i * step + step * 0.15;
    const width = step * 0.7;
    const up = b.end >= b.start;
    const [top, bottom] = [clip(Math.max(b.start, b.end)), clip(Math.min(b.start, b.end))];
    const cut = isCut(b);
    const rect = svg('rect', {
      x, width, y: Math.min(top, BOTTOM - 1.5), height: Math.max(1.5, bottom - top),
      class: (up ? 'jp-kerasmagic-up' : 'jp-kerasmagic-down') + (cut ? ' jp-mod-clipped' : '')
    });
    rect.append(svg('title', {}, `[${b.count}] ${formatDelta(b.end - b.start)} to ${formatBytes(b.end)}, ` +
      `peak ${formatBytes(b.peak)}, ${b.duration.toFixed(1)} s` + (cut ? ' (beyond the axis: cut)' : '')));
    chart.append(rect);
    if (cut) {
      clipped++;
      rect.dataset.count = String(b.count);
      // A break across the bar where the axis cuts it: what lies beyond is not drawn to scale.
      const at = Math.min(b.start, b.end) < lo ? BOTTOM - 4 : TOP + 4;
      chart.append(svg('path', {
        d: `M${x - 1} ${at + 1.5} l${width / 2 + 1} -3 l${width / 2 + 1} 3`, class: 'jp-kerasmagic-break'
      }));
    }
    if (b.peak > Math.max(b.start, b.end) + 0.005 * (hi - lo) && b.peak <= hi) {
      chart.append(svg('line', { x1: x, x2: x + width, y1: y(b.peak), y2: y(b.peak), class: 'jp-kerasmagic-peak-line' }));
    }
    if (marks.has(i)) {
      const text = formatDelta(b.end - b.start).replace('.0 ', ' ');
      // Inside the plot: never over the axis labels on the left, nor past the right edge.
      const half = (text.length * CHAR_W) / 2;
      const cx = Math.min(W - RIGHT - half, Math.max(LEFT + 2 + half, x + width / 2));
      const label = svg('text', { x: cx, y: Math.max(11, top - 3), 'text-anchor': 'middle', class: 'jp-kerasmagic-delta' }, text);
      label.dataset.count = String(b.count);
      labels.push(label);
    }
  });
  chart.append(...labels);
  chart.dataset.clipped = String(clipped);
  if (shown.length) {
    const first = shown[0].count;
    const last = shown[shown.length - 1].count;
    chart.append(svg('text', { x: LEFT + step / 2, y: H - 4, 'text-anchor': 'start', class: 'jp-kerasmagic-axis' }, `[${first}]`));
    if (last !== first) {
      chart.append(svg('text', { x: LEFT + (shown.length - 0.5) * step, y: H - 4, 'text-anchor': 'middle', class: 'jp-kerasmagic-axis' }, `[${last}]`));
    }
  }
  if (livePts.length) {
    const x0 = LEFT + columns * step;
    const t0 = livePts[0].t;
    const span = Math.max(1, livePts[livePts.length - 1].t - t0);
    const pts = livePts.map(p => `${(x0 + ((p.t - t0) / span) * (LIVE_SLOTS * step - 2)).toFixed(1)},${y(p.v).toFixed(1)}`);
    const line = svg('polyline', { points: pts.join(' '), class: 'jp-kerasmagic-live' });
    line.dataset.points = String(livePts.length);
    chart.append(line);
    chart.append(svg('text', { x: W - RIGHT, y: H - 4, 'text-anchor': 'end', class: 'jp-kerasmagic-axis' }, 'now'));
  }
  const range = `axis ${mbLabel(lo)} to ${mbLabel(hi)}` +
    (clipped ? `, scaled to the cells after [${shown[from - 1].count}]; ${clipped} cell${clipped === 1 ? '' : 's'} beyond it cut` : '');
  chart.setAttribute('aria-label', shown.length
    ? `${what} over cells ${shown[0].count} to ${shown[shown.length - 1].count}: from ${formatBytes(shown[0].start)} ` +
      `to ${formatBytes(shown[shown.length - 1].end)}; ${range}` + (livePts.length ? '; a cell is running' : '')
    : `${what} of the running cell; ${range}`);
  box.append(
    h('div', 'jp-kerasmagic-section-title', `${what} over the last ${shown.length} cells`),
    chart,
    legend(livePts.length > 0, clipped > 0)
  );
  return box;
}

function legend(live: boolean, clipped: boolean): HTMLElement {
  const item = (cls: string, text: string): HTMLElement =>
    h('span', 'jp-kerasmagic-legend-item', h('span', `jp-kerasmagic-swatch ${cls}`), text);
  const items = [
    item('jp-kerasmagic-up', 'cell grew'),
    item('jp-kerasmagic-down', 'cell shrank'),
    item('jp-kerasmagic-peak-swatch', 'in-cell peak')
  ];
  if (live) {
    items.push(item('jp-kerasmagic-live-swatch', 'running cell'));
  }
  if (clipped) {
    items.push(item('jp-kerasmagic-break-swatch', 'cut: beyond the axis'));
  }
  const el = h('div', 'jp-kerasmagic-legend', ...items);
  el.setAttribute('aria-hidden', 'true');
  return el;
}
