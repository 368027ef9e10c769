/**
 * The kerasmagic sidebar protocol (docs/protocol.md): message types and a
 * validator for what the kernel sends. Nothing here talks to a kernel.
 */

/** The comm target the kernel registers on `%load_ext kerasmagic`. */
export const TARGET = 'kerasmagic';

/** The protocol version this frontend speaks. */
export const PROTOCOL = 1;

export interface IRamInfo {
  rss_bytes: number;
  peak_rss_bytes: number | null;
  total_bytes: number;
  available_bytes: number;
}

export interface IGpuDevice {
  cuda_index: number;
  nvml_index: number | null;
  uuid: string;
  name: string;
  total_bytes: number;
  used_bytes: number;
  process_used_bytes: number | null;
}

export interface IGpuInfo {
  status: 'ok' | 'no_driver' | 'no_gpu' | 'hidden' | 'error';
  message: string | null;
  devices: IGpuDevice[];
}

export interface ITfDeviceMemory {
  device: string;
  current_bytes: number;
  peak_bytes: number;
  /** "cpu" or "gpu"; absent from kernels before kerasmagic 0.1.0's CPU allocator reading. */
  kind?: 'cpu' | 'gpu';
}

export interface ITfInfo {
  imported: boolean;
  initialized: boolean;
  devices: ITfDeviceMemory[];
}

export interface IGraphInfo {
  default_graph_ops: number | null;
  custom_gradients: number | null;
  functions: number | null;
}

export interface IKerasInfo {
  imported: boolean;
  name_counter: number | null;
  live_models: number | null;
}

/** `MemorySnapshot.to_dict()` from kerasmagic/snapshot.py. */
export interface ISnapshot {
  version: number;
  time_s: number;
  pid: number;
  ram: IRamInfo;
  gpu: IGpuInfo;
  tf: ITfInfo;
  graph: IGraphInfo;
  keras: IKerasInfo;
}

/** `OomFacts.to_dict()` from kerasmagic/oom/facts.py: how a cell ran out of memory. */
export interface IOomFacts {
  /** "tensorflow", "torch" or "jax". */
  backend: string;
  /** The device that ran out ("CPU:0", "GPU:0", "cuda:0", "gpu:0"), or null. */
  device: string | null;
  /** Bytes the failed allocation wanted, when the error says. */
  wanted_bytes: number | null;
  shape: number[] | null;
  dtype: string | null;
  /** The device's allocator after the error (an isolated child's: as it failed), or null. */
  in_use_bytes: number | null;
  peak_bytes: number | null;
  limit_bytes: number | null;
  /** Where the limit comes from, in words (a cap the user set, the GPU's total, host RAM). */
  limit_source: string | null;
  /** The one remedy the figures point to, as the kernel printed it. */
  remedy: string;
  /** Raised in a `%%fresh_model --isolate` child, which has ended since. */
  isolated: boolean;
}

/** Return `value` if it has the shape of out-of-memory facts this frontend shows, else null. */
export function readOom(value: unknown): IOomFacts | null {
  return isObject(value) && typeof value.backend === 'string' && typeof value.remedy === 'string'
    ? (value as unknown as IOomFacts)
    : null;
}

/** `CellRecord.to_dict()` from kerasmagic/live/monitor.py. */
export interface ICellRecord {
  execution_count: number;
  started_s: number;
  duration_s: number;
  start: ISnapshot;
  end: ISnapshot;
  delta: { [key: string]: number | null };
  peak_rss_bytes: number;
  peak_gpu_bytes: number | null;
  source_hash: string;
  /**
   * In a `state` or `history` reply: the leak detector's message when it flagged this run
   * (as a `cell` message's `warning`); absent from kernels that do not send it.
   */
  warning?: string | null;
  /** Set when the cell ended in an out-of-memory error; absent from older kernels. */
  oom?: IOomFacts | null;
}

/** The leak detector's verdict. */
export interface ILeakVerdict {
  growing: boolean;
  what: string;
  message: string;
  /** Whether "Free memory" ran since the verdict's last cell (absent from older kernels). */
  freed_since?: boolean;
}

/** `CleanupReport.to_dict()` from kerasmagic/cleanup/__init__.py. */
export interface ICleanupReport {
  dropped: string[];
  kept: string[];
  not_freed: string[];
  freed_bytes: number;
  tf_freed_bytes: number | null;
  elapsed_s: number;
  notes: string[];
  /** TensorFlow's custom-gradient entries the cleanup purged (null without TensorFlow). */
  purge?: { dropped: number; kept: number; unknown: number; message: string | null } | null;
}

/** One live Keras model from a scan (`LiveModel` in kerasmagic/cleanup/holders.py). */
export interface ILiveModel {
  name: string;
  type: string;
  /** Bytes of its weights and optimizer variables (counted). */
  size_bytes: number;
  /** What keeps it alive (`Out[7]`, `h.model`, `results[0]`, ...). */
  holders: string[];
  traced_ops: number | null;
  /** An estimate, not a measurement, of what its traced graphs keep. */
  estimate_bytes: number | null;
  /** Whether "Free memory" would free it on its own. */
  freeable: boolean;
  /** What frees it, one per holder, in the same order. */
  remedies: string[];
}

/** One of the largest user variables from a scan (`Variable` in kerasmagic/probes/variables.py). */
export interface IVariable {
  name: string;
  type: string;
  size_bytes: number;
}

export interface IStateMessage {
  protocol: number;
  type: 'state';
  kerasmagic_version: string;
  pid: number;
  live: boolean;
  snapshot: ISnapshot;
  history: ICellRecord[];
  verdict: ILeakVerdict | null;
}

export interface ISampleMessage {
  protocol: number;
  type: 'sample';
  snapshot: ISnapshot;
  verdict?: ILeakVerdict | null;
}

export interface ICellMessage {
  protocol: number;
  type: 'cell';
  cell: ICellRecord;
  verdict: ILeakVerdict | null;
  /** The detector's message when it flags this very cell, else null (absent from older kernels). */
  warning?: string | null;
}

export interface ISnapshotReply {
  protocol: number;
  type: 'reply';
  id: string;
  request: 'snapshot';
  snapshot: ISnapshot;
}

export interface IHistoryReply {
  protocol: number;
  type: 'reply';
  id: string;
  request: 'history';
  history: ICellRecord[];
  verdict: ILeakVerdict | null;
}

export interface IFreeReply {
  protocol: number;
  type: 'reply';
  id: string;
  request: 'free_memory';
  report: ICleanupReport;
  summary: string;
  /** Snapshots just before and just after this cleanup (`before` absent from older kernels). */
  before?: ISnapshot;
  snapshot: ISnapshot;
  verdict?: ILeakVerdict | null;
}

export interface IScanReply {
  protocol: number;
  type: 'reply';
  id: string;
  request: 'scan';
  models: ILiveModel[];
  variables: IVariable[];
}

export interface IErrorMessage {
  protocol: number;
  type: 'error';
  id: string | null;
  error: string;
}

export type Reply = ISnapshotReply | IHistoryReply | IFreeReply | IScanReply;
export type Push = IStateMessage | ISampleMessage | ICellMessage;
export type KernelMessage = Push | Reply | IErrorMessage;
export type RequestType = Reply['request'];
export type ReplyFor<K extends RequestType> = Extract<Reply, { request: K }>;

function isObject(value: unknown): value is { [key: string]: unknown } {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** Return whether `value` has the shape of a snapshot this frontend can show. */
export function isSnapshot(value: unknown): value is ISnapshot {
  return (
    isObject(value) &&
    typeof value.pid === 'number' &&
    isObject(value.ram) &&
    typeof value.ram.rss_bytes === 'number' &&
    isObject(value.gpu) &&
    Array.isArray(value.gpu.devices) &&
    isObject(value.tf) &&
    isObject(value.graph) &&
    isObject(value.keras)
  );
}

/**
 * Return the message if it is one this frontend understands, else null.
 * Checks the envelope and the snapshot fields the view reads.
 */
export function parseKernelMessage(data: unknown): KernelMessage | null {
  if (!isObject(data) || data.protocol !== PROTOCOL) {
    return null;
  }
  switch (data.type) {
    case 'state':
      return isSnapshot(data.snapshot) && Array.isArray(data.history)
        ? (data as unknown as IStateMessage)
        : null;
    case 'sample':
      return isSnapshot(data.snapshot) ? (data as unknown as ISampleMessage) : null;
    case 'cell':
      return isObject(data.cell) && isSnapshot(data.cell.end)
        ? (data as unknown as ICellMessage)
        : null;
    case 'reply':
      if (typeof data.id !== 'string' || typeof data.request !== 'string') {
        return null;
      }
      if (data.request === 'scan' && !(Array.isArray(data.models) && Array.isArray(data.variables))) {
        return null;
      }
      return data as unknown as Reply;
    case 'error':
      return typeof data.error === 'string' ? (data as unknown as IErrorMessage) : null;
    default:
      return null;
  }
}
