/**
 * Follows the code cells of one notebook: calls `onCell` for each once the notebook is ready
 * and again whenever its cells change. The base of the badges and of the report lines.
 */
import { Cell } from '@jupyterlab/cells';
import { NotebookPanel } from '@jupyterlab/notebook';
import { IDisposable } from '@lumino/disposable';
import { Signal } from '@lumino/signaling';

export abstract class CodeCellWatcher implements IDisposable {
  constructor(panel: NotebookPanel) {
    this.panel = panel;
    panel.context.ready.then(() => this._start()).catch(() => undefined);
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  dispose(): void {
    this._disposed = true;
    Signal.disconnectReceiver(this);
  }

  /** Bring one code cell up to date (a new one, or after any change to the cells). */
  protected abstract onCell(cell: Cell): void;

  /** Call `onCell` for every code cell of the notebook now. */
  protected visitAll(): void {
    if (this._disposed) {
      return;
    }
    for (const cell of this.panel.content.widgets) {
      if (cell.model.type === 'code') {
        this.onCell(cell);
      }
    }
  }

  private _start(): void {
    const cells = this.panel.content.model?.cells;
    if (!cells || this._disposed) {
      return;
    }
    // The notebook makes its cell widgets in its own handler of the same signal: wait for it.
    cells.changed.connect(() => void Promise.resolve().then(() => this.visitAll()), this);
    this.visitAll();
  }

  protected readonly panel: NotebookPanel;
  private _disposed = false;
}
