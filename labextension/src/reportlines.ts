/**
 * `%%fresh_model`'s one-line report (`kerasmagic: freed 12.5 MB in 0.16 s ...`) wraps between
 * words. JupyterLab lets every output line break anywhere (`word-break: break-all`), which cut
 * that line mid-word; only the outputs of `%%fresh_model` cells get word wrapping (their long
 * words still break where they must), every other output keeps JupyterLab's.
 */
import { Cell } from '@jupyterlab/cells';
import { NotebookPanel } from '@jupyterlab/notebook';
import { IDisposable } from '@lumino/disposable';
import { Signal } from '@lumino/signaling';

const FRESH_CELL = 'jp-kerasmagic-freshCell';

/** Whether a cell's source is a `%%fresh_model` cell (the magic on its first line). */
export function isFreshModelCell(source: string): boolean {
  return /^\s*%%fresh_model\b/.test(source);
}

/** Marks the `%%fresh_model` cells of one notebook, following edits and new cells. */
export class ReportLines implements IDisposable {
  constructor(panel: NotebookPanel) {
    this._panel = panel;
    panel.context.ready.then(() => this._start()).catch(() => undefined);
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  dispose(): void {
    this._disposed = true;
    Signal.disconnectReceiver(this);
  }

  private _start(): void {
    const cells = this._panel.content.model?.cells;
    if (!cells || this._disposed) {
      return;
    }
    // The notebook makes its cell widgets in its own handler of the same signal: wait for it.
    cells.changed.connect(() => void Promise.resolve().then(() => this._markAll()), this);
    this._markAll();
  }

  private _markAll(): void {
    if (this._disposed) {
      return;
    }
    for (const cell of this._panel.content.widgets) {
      if (cell.model.type === 'code' && !this._watched.has(cell)) {
        this._watched.add(cell);
        cell.model.contentChanged.connect(() => this._mark(cell), this);
      }
      this._mark(cell);
    }
  }

  private _mark(cell: Cell): void {
    if (!cell.isDisposed) {
      cell.toggleClass(FRESH_CELL, cell.model.type === 'code' && isFreshModelCell(cell.model.sharedModel.getSource()));
    }
  }

  private _panel: NotebookPanel;
  private _disposed = false;
  private _watched = new WeakSet<Cell>();
}
