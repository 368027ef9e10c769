/**
 * kerasmagic's lines (`kerasmagic: freed 12.5 MB in 0.16 s ...`, the leak verdict, the
 * `fresh()` summary) wrap between words. JupyterLab lets every output line break anywhere
 * (`word-break: break-all`), which cut them mid-word ("Run the ce|ll"); the outputs of
 * `%%fresh_model` cells, and of any cell where kerasmagic printed a line, get word wrapping
 * (their long words still break where they must); every other output keeps JupyterLab's.
 */
import { Cell, ICodeCellModel } from '@jupyterlab/cells';

import { CodeCellWatcher } from './cellwatch';

const WORD_WRAPPED = 'jp-kerasmagic-freshCell';
const OUR_LINE = /^kerasmagic[: ]/m;

/** Whether a cell's source is a `%%fresh_model` cell (the magic on its first line). */
export function isFreshModelCell(source: string): boolean {
  return /^\s*%%fresh_model\b/.test(source);
}

/** Whether an output's text (a stream's) holds a line kerasmagic printed. */
export function hasOurLine(text: unknown): boolean {
  const joined = Array.isArray(text) ? text.join('') : text;
  return typeof joined === 'string' && OUR_LINE.test(joined);
}

/** Marks the cells whose outputs hold kerasmagic's lines, following edits, runs and new cells. */
export class ReportLines extends CodeCellWatcher {
  protected onCell(cell: Cell): void {
    if (!this._watched.has(cell)) {
      this._watched.add(cell);
      cell.model.contentChanged.connect(() => this._mark(cell), this);
      (cell.model as ICodeCellModel).outputs?.changed.connect(() => this._mark(cell), this);
    }
    this._mark(cell);
  }

  private _mark(cell: Cell): void {
    if (cell.isDisposed) {
      return;
    }
    const outputs = (cell.model as ICodeCellModel).outputs;
    let ours = isFreshModelCell(cell.model.sharedModel.getSource());
    for (let i = 0; !ours && outputs && i < outputs.length; i++) {
      const output = outputs.get(i);
      ours = output.type === 'stream' && hasOurLine(output.toJSON().text);
    }
    cell.toggleClass(WORD_WRAPPED, ours);
  }

  private _watched = new WeakSet<Cell>();
}
