/**
 * One MemoryModel per open notebook, and which of them the sidebar shows (the
 * active notebook's). Every notebook keeps its kerasmagic comm open whether or
 * not the sidebar is visible, so cell records are never missed.
 */
import { NotebookPanel, INotebookTracker } from '@jupyterlab/notebook';
import { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';

import { MemoryModel } from './model';

export class NotebookModels implements IDisposable {
  constructor(tracker: INotebookTracker) {
    this._tracker = tracker;
    tracker.forEach(panel => this._add(panel));
    tracker.widgetAdded.connect((_, panel) => this._add(panel), this);
    tracker.currentChanged.connect(this._follow, this);
    this._follow();
  }

  /** The active notebook's model, or null without a notebook. */
  get current(): MemoryModel | null {
    return this._current;
  }

  /** Emitted when the current model changes or emits `changed`. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** Emitted with each notebook's model when it is created. */
  get added(): ISignal<this, { panel: NotebookPanel; model: MemoryModel }> {
    return this._added;
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  /** Call `fn` for the model of every open notebook. */
  forEach(fn: (panel: NotebookPanel, model: MemoryModel) => void): void {
    this._models.forEach((model, panel) => fn(panel, model));
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this._models.forEach(model => model.dispose());
    this._models.clear();
    Signal.clearData(this);
  }

  private _add(panel: NotebookPanel): void {
    if (this._models.has(panel)) {
      return;
    }
    const model = new MemoryModel(panel.sessionContext);
    this._models.set(panel, model);
    model.changed.connect(() => model === this._current && this._changed.emit(), this);
    panel.disposed.connect(() => {
      this._models.delete(panel);
      model.dispose();
      this._follow();
    });
    this._added.emit({ panel, model });
    this._follow(); // the tracker may have made it current before announcing it
  }

  private _follow(): void {
    const panel = this._tracker.currentWidget;
    const model = panel ? this._models.get(panel) ?? null : null;
    if (model !== this._current) {
      if (this._current) {
        this._current.active = false;
      }
      this._current = model;
      if (model) {
        model.active = true;
      }
    }
    this._changed.emit();
  }

  private _tracker: INotebookTracker;
  private _models = new Map<NotebookPanel, MemoryModel>();
  private _current: MemoryModel | null = null;
  private _disposed = false;
  private _changed = new Signal<this, void>(this);
  private _added = new Signal<this, { panel: NotebookPanel; model: MemoryModel }>(this);
}
