/**
 * `%%fresh_model`'s one-line report (`kerasmagic: freed 12.5 MB in 0.16 s ...`) wraps between
 * words. JupyterLab lets every output line break anywhere (`word-break: break-all`), which cut
 * that line mid-word; only the outputs of `%%fresh_model` cells get word wrapping (their long
 * words still break where they must), every other output keeps JupyterLab's.
 */
import { Cell } from '@jupyterlab/cells';

import { CodeCellWatcher } from './cellwatch';

const FRESH_CELL = 'jp-kerasmagic-freshCell';

/** Whether a cell's source is a `%%fresh_model` cell (the magic on its first line). */
export function isFreshModelCell(source: string): boolean {
  return /^\s*%%fresh_model\b/.test(source);
}

/** Marks the `%%fresh_model` cells of one notebook, following edits and new cells. */
export class ReportLines extends CodeCellWatcher {
  protected onCell(cell: Cell): void {
    if (!this._watched.has(cell)) {
      this._watched.add(cell);
      cell.model.contentChanged.connect(() => this._mark(cell), this);
    }
    this._mark(cell);
  }

  private _mark(cell: Cell): void {
    if (!cell.isDisposed) {
      cell.toggleClass(FRESH_CELL, isFreshModelCell(cell.model.sharedModel.getSource()));
    }
  }

  private _watched = new WeakSet<Cell>();
}
