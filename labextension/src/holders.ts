/**
 * What holds a model, said once: an error's frames as "the stored error (8 frames)", holders
 * that share a remedy on one line, and two models of the same Keras name told apart by what
 * holds them. The same rules as `%gpu_mem --deep` (kerasmagic/views/render.py). No DOM here.
 */
import { ILiveModel } from './protocol';

const STORED_ERROR = 'sys.last_';
const FRAME = /^(sys\.last_\w+ \([^:]+):/; // "sys.last_traceback (train: model)"

/** A holder as shown: a name from the kernel, or words standing for several (`exact`). */
export interface IHolder {
  shown: string;
  remedy: string;
  exact: string[];
}

/** One line of holders sharing a remedy. */
export interface IHolderLine {
  items: IHolder[];
  remedy: string;
}

/** Whether a shown holder is words for several of the kernel's names, not one of them. */
export function isGroup(h: IHolder): boolean {
  return h.exact.length !== 1 || h.exact[0] !== h.shown;
}

/**
 * Return the holders with two or more entries of the stored error (one per frame and local:
 * `sys.last_traceback (fit: self)`, `sys.last_value (...)`) as one, "the stored error (N
 * frames)", where the first was; `exact` lists what each shown holder stands for.
 */
export function groupHolders(
  holders: ReadonlyArray<string>,
  remedies: ReadonlyArray<string>
): IHolder[] {
  const pairs = holders.map((h, i) => ({ shown: h, remedy: remedies[i] ?? '', exact: [h] }));
  const error = pairs.filter(p => p.shown.startsWith(STORED_ERROR));
  if (error.length < 2) {
    return pairs;
  }
  const frames = new Set(error.map(p => FRAME.exec(p.shown)?.[1]).filter(f => f !== undefined)).size;
  const name = 'the stored error' + (frames ? ` (${frames} frame${frames === 1 ? '' : 's'})` : '');
  const first = pairs.indexOf(error[0]);
  const rest = pairs.filter(p => !p.shown.startsWith(STORED_ERROR));
  const grouped = { shown: name, remedy: error[0].remedy, exact: error.map(p => p.shown) };
  return [...rest.slice(0, first), grouped, ...rest.slice(first)];
}

/** Return the holders, those that share a remedy on one line, each shown holder once. */
export function holderLines(holders: ReadonlyArray<string>, remedies: ReadonlyArray<string>): IHolderLine[] {
  const lines = new Map<string, IHolderLine>();
  for (const h of groupHolders(holders, remedies)) {
    const line = lines.get(h.remedy) ?? { items: [], remedy: h.remedy };
    if (!line.items.some(item => item.shown === h.shown)) {
      line.items.push(h);
    }
    lines.set(h.remedy, line);
  }
  return [...lines.values()];
}

/**
 * Return what tells each model apart from another of the same Keras name (Keras names again
 * from `sequential` after a reset): the first holder (`held as Out[3]`), else `#1`, `#2`;
 * '' for a name no other model has.
 */
export function modelDistinctions(models: ReadonlyArray<ILiveModel>): string[] {
  const count = (xs: string[], x: string): number => xs.filter(y => y === x).length;
  const names = models.map(m => m.name);
  const which = models.map(m => {
    if (count(names, m.name) === 1) {
      return '';
    }
    const first = groupHolders(m.holders, m.remedies)[0];
    return first ? `held as ${first.shown}` : '';
  });
  const labels = models.map((m, i) => `${m.name}\u0000${which[i]}`);
  const seen = new Map<string, number>();
  return which.map((w, i) => {
    if (count(labels, labels[i]) === 1) {
      return w;
    }
    const n = (seen.get(labels[i]) ?? 0) + 1;
    seen.set(labels[i], n);
    return w ? `${w} #${n}` : `#${n}`;
  });
}

/**
 * Return a cleanup's dropped holders in words: the stored error's entries as one, and a single
 * one named as such first (`the stored error (sys.last_traceback)`).
 */
export function droppedText(dropped: ReadonlyArray<string>): string[] {
  return groupHolders(dropped, []).map(h =>
    h.shown.startsWith(STORED_ERROR) ? `the stored error (${h.shown})` : h.shown);
}
