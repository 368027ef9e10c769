/**
 * The kerasmagic sidebar protocol (docs/protocol.md): message types and a
 * validator for what the kernel sends. Nothing here talks to a kernel.
 */

/** The comm target the kernel registers on `%load_ext kerasmagic`. */
export const TARGET = 'kerasmagic';

/** The protocol version this frontend speaks. */
export const PROTOCOL = 3;

// The data types (snapshots, cell records, reports, scans) are generated from the Python
// dataclasses into ./wire.ts; tests/test_protocol_schema.py keeps the two in step.
export type {
  IBackendDevice,
  IBackendInfo,
  ICellRecord,
  ICleanupReport,
  IGpuDevice,
  IGpuInfo,
  IKerasInfo,
  IOomFacts,
  ILeakVerdict,
  ILiveModel,
  IRamInfo,
  ISnapshot,
  ISnapshotDelta,
  IVariable
} from './wire';
import type {
  ICellRecord,
  ICleanupReport,
  ILeakVerdict,
  ILiveModel,
  IOomFacts,
  ISnapshot,
  IVariable
} from './wire';

/** Return `value` if it has the shape of out-of-memory facts this frontend shows, else null. */
export function readOom(value: unknown): IOomFacts | null {
  return isObject(value) && typeof value.backend === 'string' && typeof value.remedy === 'string'
    ? (value as unknown as IOomFacts)
    : null;
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
  named_models?: number | null;
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

function isBackend(value: unknown): boolean {
  return (
    isObject(value) &&
    typeof value.name === 'string' &&
    Array.isArray(value.devices) &&
    isObject(value.caches)
  );
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
    Array.isArray(value.backends) &&
    value.backends.every(isBackend) &&
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
