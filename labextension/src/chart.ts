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

const CHAR_W = 6.7; // a digit's width at the chart's 11-unit font, for keeping labels in the plot
const TEXT_H = 9; // a label's height above its baseline at that font
const TEXT_GAP = 4; // the least room between two x-axis labels

/** The x-axis labels: the first and the last cell under their bars; where the two would touch
 * (two or three cells on a wide column grid), one label for the range, centred under it. */
function xLabels(first: number, last: number, n: number, step: number, right: number): SVGElement[] {
  const text = (x: number, anchor: string, value: string): SVGElement =>
    svg('text', { x, y: H - 4, 'text-anchor': anchor, class: 'jp-kerasmagic-axis jp-kerasmagic-x' }, value);
  const start = LEFT + step * 0.15; // the first bar's left edge: its label starts there
  const end = LEFT + (n - 0.15) * step; // the last bar's right edge: its label ends there
  if (last === first) {
    return [text(start, 'start', `[${first}]`)];
  }
  const [a, b] = [`[${first}]`, `[${last}]`];
  if (start + a.length * CHAR_W + TEXT_GAP <= end - b.length * CHAR_W) {
    return [text(start, 'start', a), text(end, 'end', b)];
  }
  const both = `[${first}]–[${last}]`;
  const half = (both.length * CHAR_W) / 2;
  return [text(Math.min(right - half, Math.max(LEFT + half, (start + end) / 2)), 'middle', both)];
}

/**
 * The changes worth a label, in the order they get one: first the jumps the axis cuts (their
 * size is only in the label), then, biggest first, the changes in scale of at least 1 MB and a
 * quarter of the largest of them. Where each goes is `placeLabels`' choice.
 */
function labelled(shown: IBar[], from: number, cut: (b: IBar) => boolean): number[] {
  const big = (b: IBar): number => Math.abs(b.end - b.start);
  const largest = Math.max(0, ...shown.slice(from).map(big));
  const bySize = (a: number, b: number): number => big(shown[b]) - big(shown[a]);
  const indices = shown.map((_, i) => i);
  const jumps = indices.filter(i => cut(shown[i]) && big(shown[i]) >= JUMP_FLOOR).sort(bySize);
  const changes = indices.filter(i => i >= from && !cut(shown[i]) && big(shown[i]) >= Math.max(MB, largest / 4))
    .sort(bySize);
  return [...jumps, ...changes];
}

/** A label's box in the chart's units: its centre, half its width, its baseline. */
interface ILabelBox {
  index: number;
  text: string;
  cx: number;
  half: number;
  baseline: number;
}

/**
 * Place each change label above its own bar, inside the bars' part of the plot (`right`: not
 * over the running cell's line), and above every bar and peak tick it spans: a label wider
 * than its column lies over its neighbours' columns, so it goes above the highest of them. A
 * label with no room there, or that would touch one placed before it, is left out (the bar's
 * tooltip still says it).
 */
function placeLabels(shown: IBar[], order: number[], tops: number[], step: number, right: number): ILabelBox[] {
  const width = step * 0.7;
  const placed: ILabelBox[] = [];
  for (const i of order) {
    const b = shown[i];
    const text = formatDelta(b.end - b.start).replace('.0 ', ' ');
    const half = (text.length * CHAR_W) / 2;
    const cx = Math.min(right - half, Math.max(LEFT + 2 + half, LEFT + i * step + step / 2));
    const spanned = tops.filter((_, j) => {
      const left = LEFT + j * step + step * 0.15;
      return left < cx + half && left + width > cx - half;
    });
    const baseline = Math.min(...spanned) - 4; // the text's descent stays off the bars
    const touches = placed.some(p => Math.abs(p.cx - cx) < p.half + half + 2 &&
      Math.abs(p.baseline - baseline) < TEXT_H + 2);
    if (baseline - TEXT_H >= 0 && !touches) {
      placed.push({ index: i, text, cx, half, baseline });
    }
  }
  return placed;
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
  const right = livePts.length ? LEFT + columns * step : W - RIGHT; // the bars' part of the plot
  // Where each bar's drawing starts from the top: its bar or its peak tick, whichever is higher.
  const tops = shown.map(b => clip(b.peak <= hi ? Math.max(b.start, b.end, b.peak) : Math.max(b.start, b.end)));
  const marks = placeLabels(shown, labelled(shown, from, isCut), tops, step, right);
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
  });
  for (const m of marks) { // drawn after every bar: no later bar covers one
    const label = svg('text', { x: m.cx, y: m.baseline, 'text-anchor': 'middle', class: 'jp-kerasmagic-delta' }, m.text);
    label.dataset.count = String(shown[m.index].count);
    chart.append(label);
  }
  chart.dataset.clipped = String(clipped);
  if (shown.length) {
    chart.append(...xLabels(shown[0].count, shown[shown.length - 1].count, shown.length, step, right));
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
  // No count of cells before there are two: the first cell is running, or one is recorded.
  const title = shown.length === 0 ? `${what} of the running cell`
    : shown.length === 1 ? `${what} over the last cell` : `${what} over the last ${shown.length} cells`;
  box.append(
    h('div', 'jp-kerasmagic-section-title', title),
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
