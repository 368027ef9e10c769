/**
 * The sidebar's history chart: each recent cell's change drawn from its start to
 * its end figure on an axis scaled to the data, its in-cell peak as a tick, the
 * running cell's samples as a live line, labelled axis values and a legend.
 * Pure SVG; colours come from the stylesheet (theme variables only).
 */
import { formatBytes, formatDelta } from './format';
import { ILivePoint, gpuUsedBytes } from './model';
import { ICellRecord } from './protocol';

const SVG = 'http://www.w3.org/2000/svg';
export const CHART_CELLS = 20;
const W = 280;
const H = 118;
const LEFT = 48; // axis labels
const RIGHT = 6;
const TOP = 14; // room for the delta labels
const BOTTOM = 100; // x-axis labels below
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

function bars(cells: ReadonlyArray<ICellRecord>, useGpu: boolean): IBar[] {
  return cells.map(c => {
    const start = (useGpu ? gpuUsedBytes(c.start) : c.start.ram.rss_bytes) ?? 0;
    const end = (useGpu ? gpuUsedBytes(c.end) : c.end.ram.rss_bytes) ?? 0;
    const peak = Math.max(start, end, (useGpu ? c.peak_gpu_bytes : c.peak_rss_bytes) ?? 0);
    return { count: c.execution_count, start, end, peak, duration: c.duration_s };
  });
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

const LABEL_GAP = 34; // a "+48 MB" label's width at the chart's font size

/**
 * Label the largest changes (at least 1 MB and a quarter of the largest), biggest first,
 * skipping any that would overlap a label already placed.
 */
function labelled(shown: IBar[], step: number): Set<number> {
  const big = (b: IBar): number => Math.abs(b.end - b.start);
  const largest = Math.max(0, ...shown.map(big));
  const order = shown.map((_, i) => i).sort((a, b) => big(shown[b]) - big(shown[a]));
  const out = new Set<number>();
  for (const i of order) {
    if (big(shown[i]) < Math.max(MB, largest / 4)) {
      break;
    }
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
  useGpu: boolean
): HTMLElement {
  const shown = bars(cells.slice(-CHART_CELLS), useGpu);
  const livePts = live
    .map(p => ({ t: p.time_s, v: useGpu ? p.gpu_bytes : p.rss_bytes }))
    .filter((p): p is { t: number; v: number } => p.v !== null);
  const what = useGpu ? 'VRAM' : 'RSS';
  const box = h('div', 'jp-kerasmagic-history');
  box.dataset.km = 'history';
  box.dataset.cells = String(cells.length);
  if (!shown.length && !livePts.length) {
    box.append(h('div', 'jp-kerasmagic-section-title', what),
      h('div', 'jp-kerasmagic-note', 'No cells recorded yet.'));
    return box;
  }
  const values = [...shown.flatMap(b => [b.start, b.end, b.peak]), ...livePts.map(p => p.v)];
  const [lo, hi] = axisRange(values);
  const y = (v: number): number => BOTTOM - ((v - lo) / (hi - lo)) * (BOTTOM - TOP);
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
  const marks = labelled(shown, step);
  shown.forEach((b, i) => {
    const x = LEFT + i * step + step * 0.15;
    const width = step * 0.7;
    const up = b.end >= b.start;
    const top = y(Math.max(b.start, b.end));
    const rect = svg('rect', {
      x, width, y: top, height: Math.max(1.5, Math.abs(y(b.start) - y(b.end))),
      class: up ? 'jp-kerasmagic-up' : 'jp-kerasmagic-down'
    });
    rect.append(svg('title', {}, `[${b.count}] ${formatDelta(b.end - b.start)} to ${formatBytes(b.end)}, ` +
      `peak ${formatBytes(b.peak)}, ${b.duration.toFixed(1)} s`));
    chart.append(rect);
    if (b.peak > Math.max(b.start, b.end) + 0.005 * (hi - lo)) {
      chart.append(svg('line', { x1: x, x2: x + width, y1: y(b.peak), y2: y(b.peak), class: 'jp-kerasmagic-peak-line' }));
    }
    if (marks.has(i)) {
      const label = svg('text', { x: x + width / 2, y: Math.max(9, top - 3), 'text-anchor': 'middle', class: 'jp-kerasmagic-delta' },
        formatDelta(b.end - b.start).replace('.0 ', ' '));
      label.dataset.count = String(b.count);
      chart.append(label);
    }
  });
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
  const range = `axis ${mbLabel(lo)} to ${mbLabel(hi)}`;
  chart.setAttribute('aria-label', shown.length
    ? `${what} over cells ${shown[0].count} to ${shown[shown.length - 1].count}: from ${formatBytes(shown[0].start)} ` +
      `to ${formatBytes(shown[shown.length - 1].end)}; ${range}` + (livePts.length ? '; a cell is running' : '')
    : `${what} of the running cell; ${range}`);
  box.append(
    h('div', 'jp-kerasmagic-section-title', `${what} over the last ${shown.length} cells`),
    chart,
    legend(livePts.length > 0)
  );
  return box;
}

function legend(live: boolean): HTMLElement {
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
  const el = h('div', 'jp-kerasmagic-legend', ...items);
  el.setAttribute('aria-hidden', 'true');
  return el;
}
