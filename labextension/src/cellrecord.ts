/**
 * Per-cell memory records: each "cell" message the kernel pushes is matched to
 * the notebook cell that ran it (by execution count) and written into that
 * cell's metadata as `metadata.kerasmagic`, so a saved notebook keeps it.
 */
import { ICodeCellModel } from '@jupyterlab/cells';
import { NotebookPanel } from '@jupyterlab/notebook';
import { IDisposable } from '@lumino/disposable';

import { leadOf } from './lead';
import { MemoryModel, gpuUsedBytes, tfBytes } from './model';
import { ICellRecord, IOomFacts, readOom } from './protocol';

/** The cell-metadata key of the record. */
export const METADATA_KEY = 'kerasmagic';

/** `metadata.kerasmagic` of an executed code cell (docs/sidebar.md). */
export interface ICellMemory {
  execution_count: number;
  duration_s: number;
  rss_bytes: number;
  rss_delta_bytes: number | null;
  peak_rss_bytes: number;
  gpu_bytes: number | null;
  gpu_delta_bytes: number | null;
  peak_gpu_bytes: number | null;
  models_delta: number | null;
  /** TensorFlow's tensors (its allocator, exact) at the end and over the cell; absent before 0.1.0's CPU reading. */
  tf_bytes?: number | null;
  tf_delta_bytes?: number | null;
  /** What the cell's headline was (`snapshot.py`): the allocator's tensors, VRAM or RSS. */
  lead?: 'allocator' | 'vram' | 'rss';
  warning: string | null;
  /** How the cell ran out of memory, else null; absent from records saved before 0.1.0's OOM. */
  oom?: IOomFacts | null;
}

/** Return the metadata record of one cell record, with the leak detector's mark for it. */
export function cellMemory(c: ICellRecord, warning: string | null): ICellMemory {
  const gpu = gpuUsedBytes(c.end);
  return {
    execution_count: c.execution_count,
    duration_s: Math.round(c.duration_s * 1000) / 1000,
    rss_bytes: c.end.ram.rss_bytes,
    rss_delta_bytes: c.delta.rss_bytes ?? null,
    peak_rss_bytes: Math.max(c.peak_rss_bytes, c.end.ram.rss_bytes, c.start.ram.rss_bytes),
    gpu_bytes: gpu,
    gpu_delta_bytes: gpu === null ? null : c.delta.gpu_used_bytes ?? null,
    peak_gpu_bytes: gpu === null ? null : Math.max(c.peak_gpu_bytes ?? 0, gpu),
    models_delta: c.delta.live_models ?? null,
    tf_bytes: tfBytes(c.end),
    tf_delta_bytes: c.delta.device_bytes.tensorflow ?? null,
    lead: leadOf(c.end).what,
    warning,
    oom: readOom(c.oom)
  };
}

/** Return the record in a cell's metadata if it has the expected shape, else null. */
export function readCellMemory(value: unknown): ICellMemory | null {
  if (typeof value !== 'object' || value === null) {
    return null;
  }
  const v = value as { [key: string]: unknown };
  return typeof v.execution_count === 'number' && typeof v.rss_bytes === 'number'
    ? (value as ICellMemory)
    : null;
}

const KEEP = 200; // unmatched records and counts remembered per kernel

/**
 * Matches one notebook's cell records to its cells. A record and the cell's new execution
 * count arrive in either order (the record on iopub, the count with the execute reply), so
 * whichever comes first waits for the other. Only counts that a run from this page gave a
 * cell since this kernel (re)started are matched: a cell still showing [5] from the file or
 * from before a restart is never mistaken for this kernel's cell 5.
 *
 * Records also come in the history of a `state` message. That matters for Run All: the comm's
 * hello reaches the kernel only after every queued cell has run (JupyterLab sends it to the
 * main shell, behind them), so the cells after `%load_ext kerasmagic` get no `cell` message;
 * their records are in the history the kernel answers the hello with.
 */
export class CellRecorder implements IDisposable {
  constructor(panel: NotebookPanel, model: MemoryModel) {
    this._panel = panel;
    model.cellRecorded.connect((_, message) => this._onRecord(message.cell, message.warning ?? null), this);
    model.historyReceived.connect((_, history) => {
      for (const record of history) {
        this._onRecord(record, record.warning ?? null);
      }
    }, this);
    model.kernelRestarted.connect(() => {
      this._waiting.clear();
      this._ran.clear();
    }, this);
    panel.context.ready.then(() => this._watchCells()).catch(() => undefined);
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  dispose(): void {
    this._disposed = true;
    this._waiting.clear();
    this._ran.clear();
  }

  private _watchCells(): void {
    const cells = this._panel.content.model?.cells;
    if (!cells || this._disposed) {
      return;
    }
    const watch = (): void => {
      for (let i = 0; i < cells.length; i++) {
        const cell = cells.get(i);
        if (cell.type === 'code' && !this._watched.has(cell)) {
          this._watched.add(cell);
          cell.stateChanged.connect((_, args) => {
            const change = args as { name: string; newValue: unknown };
            if (change.name === 'executionState' && change.newValue === 'running') {
              this._executing.add(cell);
            } else if (change.name === 'executionCount' && typeof change.newValue === 'number') {
              // Only a count this frontend's run produced: not one loaded from the file.
              if (this._executing.delete(cell)) {
                this._onCount(cell as ICodeCellModel, change.newValue);
              }
            }
          }, this);
        }
      }
    };
    cells.changed.connect(watch, this);
    watch();
  }

  private _onRecord(record: ICellRecord, warning: string | null): void {
    const memory = cellMemory(record, warning);
    const cell = this._ran.get(memory.execution_count);
    if (cell !== undefined && !cell.isDisposed) {
      this._ran.delete(memory.execution_count);
      cell.setMetadata(METADATA_KEY, memory);
    } else {
      remember(this._waiting, memory.execution_count, memory);
    }
  }

  private _onCount(cell: ICodeCellModel, count: number): void {
    const memory = this._waiting.get(count);
    if (memory !== undefined) {
      this._waiting.delete(count);
      cell.setMetadata(METADATA_KEY, memory);
    } else {
      remember(this._ran, count, cell);
    }
  }

  private _panel: NotebookPanel;
  private _disposed = false;
  private _watched = new WeakSet<object>();
  private _executing = new WeakSet<object>();
  private _waiting = new Map<number, ICellMemory>();
  private _ran = new Map<number, ICodeCellModel>();
}

function remember<V>(map: Map<number, V>, key: number, value: V): void {
  map.set(key, value);
  if (map.size > KEEP) {
    map.delete(map.keys().next().value as number);
  }
}
