/**
 * One notebook's kernel as kerasmagic sees it: whether kerasmagic answers there,
 * the latest snapshot, the cell history, the running cell's samples, the leak
 * verdict and the last "Free memory" result. Every open notebook has one (so
 * cell records arrive while the sidebar is closed); the sidebar shows the
 * active notebook's. No DOM here.
 */
import { ISessionContext } from '@jupyterlab/apputils';
import { PageConfig } from '@jupyterlab/coreutils';
import { Kernel, KernelMessage as KM } from '@jupyterlab/services';
import { IDisposable } from '@lumino/disposable';
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import {
  ICellMessage,
  ICellRecord,
  ICleanupReport,
  ILeakVerdict,
  IOomFacts,
  IBackendInfo,
  ISnapshot,
  Push,
  TARGET,
  readOom
} from './protocol';
import { LeadKind, gpuUsedBytes, leadOf } from './lead';
import { ChannelEnd, KernelChannel } from './request';
import { IScanState, Scanner } from './scan';

/** Where the sidebar stands with the active notebook's kernel. */
export type Status =
  | 'no-notebook'
  | 'no-kernel'
  | 'connecting'
  | 'not-loaded'
  | 'live';

export interface IFreeState {
  phase: 'idle' | 'queued' | 'running' | 'done' | 'failed';
  report: ICleanupReport | null;
  summary: string;
  /** RSS just before and just after the cleanup itself (from its reply). */
  rssBeforeBytes: number | null;
  rssAfterBytes: number | null;
}

/** The kernel's latest out-of-memory error: its cell, the facts, whether memory was freed since. */
export interface ILastOom {
  execution_count: number;
  oom: IOomFacts;
  freedSince: boolean;
}

const NO_FREE: IFreeState = {
  phase: 'idle',
  report: null,
  summary: '',
  rssBeforeBytes: null,
  rssAfterBytes: null
};

/** How long "Free memory" may run without an answer (page config `kerasmagicFreeTimeoutMs`). */
function freeTimeoutMs(): number {
  const configured = Number(PageConfig.getOption('kerasmagicFreeTimeoutMs'));
  return configured > 0 ? configured : 60000;
}

const HISTORY_CELLS = 30;
const STALE_MS = 8000;
const CONNECT_TIMEOUT_MS = 20000;
const GONE: ReadonlyArray<Kernel.Status> = [
  'restarting',
  'autorestarting',
  'dead',
  'terminating',
  'unknown'
];

/** TensorFlow's entry of the snapshot's backends, or null when TensorFlow is not in use. */
export function tensorflow(s: ISnapshot): IBackendInfo | null {
  return s.backends.find(b => b.name === 'tensorflow') ?? null;
}

/** One of TensorFlow's cache sizes (`functions`, `custom_gradients`, ...), or null. */
export function tfCache(s: ISnapshot, name: string): number | null {
  return tensorflow(s)?.caches[name] ?? null;
}

/** Bytes of TensorFlow tensors over every device that keeps statistics, or null. */
export function tfBytes(s: ISnapshot): number | null {
  const devices = tensorflow(s)?.devices ?? [];
  return devices.length ? devices.reduce((n, d) => n + (d.in_use_bytes ?? 0), 0) : null;
}

export { gpuUsedBytes };

/** A sample of the running cell: when, and the figure the chart shows (its headline's). */
export interface ILivePoint {
  time_s: number;
  rss_bytes: number;
  gpu_bytes: number | null;
  lead: LeadKind;
  lead_bytes: number;
}

const LIVE_POINTS = 240; // two minutes at two samples a second

export class MemoryModel implements IDisposable {
  constructor(session: ISessionContext) {
    this._session = session;
    session.kernelChanged.connect(this._restart, this);
    session.statusChanged.connect(this._onStatus, this);
    session.iopubMessage.connect(this._onIopub, this);
    this._poll = new Poll({
      factory: () => this._tick(),
      frequency: { interval: 3000, backoff: false },
      name: 'kerasmagic:memory',
      standby: 'when-hidden'
    });
    this._restart();
  }

  /** Emitted on every change the view shows. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get status(): Status {
    return this._status;
  }
  /** The kernel's execution state ('idle', 'busy', ...), or null without a kernel. */
  get kernelStatus(): Kernel.Status | null {
    return this._session?.session?.kernel?.status ?? null;
  }
  get notebookPath(): string {
    return this._session?.path ?? '';
  }
  get kernelName(): string {
    return this._session?.kernelDisplayName ?? '';
  }
  get kerasmagicVersion(): string {
    return this._version;
  }
  /** Whether the kernel runs the live monitor (pushes during cells). */
  get live(): boolean {
    return this._live;
  }
  get snapshot(): ISnapshot | null {
    return this._snapshot;
  }
  get history(): ReadonlyArray<ICellRecord> {
    return this._history;
  }
  get verdict(): ILeakVerdict | null {
    return this._verdict;
  }
  get free(): IFreeState {
    return this._free;
  }
  /** The latest cell of this kernel that ran out of memory, until dismissed or a restart. */
  get lastOom(): ILastOom | null {
    return this._lastOom;
  }

  /** Stop showing the latest out-of-memory error (the next one shows again). */
  dismissOom(): void {
    this._lastOom = null;
    this._changed.emit();
  }
  /** The last "What holds memory" scan and its phase. */
  get scan(): IScanState {
    return this._scanner.state;
  }
  /** Samples pushed while the current cell runs (empty between cells). */
  get running(): ReadonlyArray<ILivePoint> {
    return this._running;
  }
  /** Each cell record the kernel pushes, with its own leak warning (for the cell badges). */
  get cellRecorded(): ISignal<this, ICellMessage> {
    return this._cellRecorded;
  }
  /** Emitted with the cell records a `state` message carries (on connecting to a kernel). */
  get historyReceived(): ISignal<this, ReadonlyArray<ICellRecord>> {
    return this._historyReceived;
  }
  /** Emitted when this model's kernel changes or restarts (execution counts start over). */
  get kernelRestarted(): ISignal<this, void> {
    return this._kernelRestarted;
  }
  /** Whether the sidebar shows this model (only then does it poll a silent kernel). */
  get active(): boolean {
    return this._active;
  }
  set active(value: boolean) {
    this._active = value;
  }
  /** Traced tf.functions at the last reading that counted them (cells skip the count), or null. */
  get functions(): number | null {
    return (this._snapshot ? tfCache(this._snapshot, 'functions') : null) ?? this._functions;
  }
  /** The last error the kernel or the connection reported, or ''. */
  get error(): string {
    return this._error;
  }
  get isDisposed(): boolean {
    return this._disposed;
  }

  /** Run `%load_ext kerasmagic` silently in the kernel, then connect. */
  async loadExtension(): Promise<void> {
    const kernel = this._session?.session?.kernel;
    if (!kernel) {
      return;
    }
    this._error = '';
    this._status = 'connecting';
    this._changed.emit();
    const future = kernel.requestExecute({
      code: '%load_ext kerasmagic',
      silent: true,
      store_history: false,
      allow_stdin: false,
      stop_on_error: false
    });
    const reply = await future.done;
    if (reply.content.status === 'error') {
      const content = reply.content as KM.IReplyErrorContent;
      this._error = `%load_ext kerasmagic failed: ${content.ename}: ${content.evalue}`;
      this._status = 'not-loaded';
      this._changed.emit();
      return;
    }
    this._connect();
  }

  /** Ask the kernel to run kerasmagic's cleanup; it waits for a running cell to finish. */
  async freeMemory(): Promise<void> {
    const channel = this._channel;
    if (!channel || this._free.phase === 'queued' || this._free.phase === 'running') {
      return;
    }
    const token = ++this._freeToken;
    this._setFree({ ...NO_FREE, phase: this._cellRunning ? 'queued' : 'running' });
    try {
      const reply = await channel.request('free_memory');
      if (token !== this._freeToken) {
        return;
      }
      this._setFree({
        phase: 'done',
        report: reply.report,
        summary: reply.summary,
        rssBeforeBytes: reply.before?.ram.rss_bytes ?? null,
        rssAfterBytes: reply.snapshot.ram.rss_bytes
      });
      if (reply.verdict !== undefined) {
        this._verdict = reply.verdict;
      }
      if (this._lastOom !== null) {
        this._lastOom = { ...this._lastOom, freedSince: true };
      }
      this._setSnapshot(reply.snapshot);
      this._scanner.markStale();
    } catch (error) {
      if (token === this._freeToken) {
        this._failFree(error instanceof Error ? error.message : String(error));
      }
    }
    this._changed.emit();
  }

  /** Ask the kernel what holds memory (each live model, its holders; the largest data). */
  async scanMemory(): Promise<void> {
    await this._scanner.scan(this._channel, this._cellRunning);
  }

  /** Set the free state; a running cleanup gets a deadline, after which the button works again. */
  private _setFree(state: IFreeState): void {
    this._free = state;
    window.clearTimeout(this._freeTimer);
    if (state.phase === 'running') {
      const token = this._freeToken;
      const ms = freeTimeoutMs();
      this._freeTimer = window.setTimeout(() => {
        if (token === this._freeToken && this._free.phase === 'running') {
          this._failFree(`no answer from the kernel within ${Math.round(ms / 1000)} s`);
          this._changed.emit();
        }
      }, ms);
    }
    this._changed.emit();
  }

  /** End the pending "Free memory" (a late answer is ignored) and say why. */
  private _failFree(why: string): void {
    this._freeToken++;
    this._setFree({ ...this._free, phase: 'failed', summary: why });
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    window.clearTimeout(this._freeTimer);
    this._scanner.dispose();
    this._poll.dispose();
    this._closeChannel();
    this._listen(null);
    Signal.disconnectAll(this);
    Signal.disconnectReceiver(this);
    Signal.clearData(this);
  }

  /** Forget everything about the previous kernel and connect to the current one. */
  private _restart(): void {
    this._closeChannel();
    this._snapshot = null;
    this._functions = null;
    this._history = [];
    this._running = [];
    this._verdict = null;
    this._lastOom = null;
    this._version = '';
    this._error = '';
    this._kernelRestarted.emit();
    if (this._free.phase !== 'failed') {
      this._freeToken++;
      this._setFree(NO_FREE);
    }
    this._cellRunning = false;
    this._scanner.reset();
    this._connect();
  }

  /** Take the comms the kernel opens (`%load_ext` announces one) on the current kernel. */
  private _listen(kernel: Kernel.IKernelConnection | null): void {
    if (this._listening === kernel) {
      return;
    }
    if (this._listening && !this._listening.isDisposed) {
      this._listening.removeCommTarget(TARGET, this._onKernelComm);
    }
    this._listening = kernel;
    kernel?.registerCommTarget(TARGET, this._onKernelComm);
  }

  /** The kernel opened a comm (kerasmagic just loaded): it replaces any channel of this page. */
  private _onKernelComm = (comm: Kernel.IComm, msg: KM.ICommOpenMsg): void => {
    const kernel = this._listening;
    if (this._disposed || kernel === null || kernel !== this._session?.session?.kernel) {
      comm.close();
      return;
    }
    this._closeChannel();
    this._adopt(new KernelChannel(kernel, [comm, msg]));
    this._changed.emit();
  };

  private _adopt(channel: KernelChannel): void {
    channel.pushed.connect(this._onPush, this);
    channel.ended.connect(this._onEnded, this);
    channel.errors.connect((_, e) => {
      this._error = e.error;
      this._changed.emit();
    });
    this._channel = channel;
    this._connectStartedMs = Date.now();
    this._status = 'connecting';
  }

  private _connect(): void {
    const kernel = this._session?.session?.kernel ?? null;
    this._listen(kernel);
    if (this._channel && this._channel.kernel === kernel && !this._channel.isDisposed) {
      return;
    }
    this._closeChannel();
    if (!kernel || GONE.includes(kernel.status)) {
      this._status = 'no-kernel';
    } else {
      try {
        this._adopt(new KernelChannel(kernel));
      } catch (error) {
        this._status = 'no-kernel';
        this._error = String(error);
      }
    }
    this._changed.emit();
  }

  private _closeChannel(): void {
    if (this._channel) {
      this._channel.dispose();
      this._channel = null;
    }
  }

  private _onPush(channel: KernelChannel, message: Push): void {
    if (channel !== this._channel) {
      return;
    }
    switch (message.type) {
      case 'state':
        this._status = 'live';
        this._version = message.kerasmagic_version;
        this._live = message.live;
        this._history = message.history.slice(-HISTORY_CELLS);
        this._verdict = message.verdict;
        this._setSnapshot(message.snapshot);
        for (const record of message.history) {
          this._noteOom(record);
        }
        this._historyReceived.emit(message.history);
        break;
      case 'sample':
        this._setSnapshot(message.snapshot);
        if (this._cellRunning) { // not the kernel's status: a comm's subshell turns it idle
          this._addLivePoint(message.snapshot);
        }
        if (message.verdict !== undefined) {
          this._verdict = message.verdict;
        }
        break;
      case 'cell':
        this._history = [...this._history, message.cell].slice(-HISTORY_CELLS);
        this._running = [];
        this._verdict = message.verdict;
        this._setSnapshot(message.cell.end);
        this._noteOom(message.cell);
        this._scanner.markStale();
        this._cellRecorded.emit(message);
        break;
    }
    this._changed.emit();
  }

  /** Keep a record's out-of-memory error as the latest (records come oldest first). */
  private _noteOom(record: ICellRecord): void {
    const oom = readOom(record.oom);
    if (oom !== null && record.execution_count !== this._lastOom?.execution_count) {
      this._lastOom = { execution_count: record.execution_count, oom, freedSince: false };
    }
  }

  private _addLivePoint(s: ISnapshot): void {
    const last = this._running[this._running.length - 1];
    if (last !== undefined && s.time_s <= last.time_s) {
      return;
    }
    const lead = leadOf(s);
    const point = {
      time_s: s.time_s, rss_bytes: s.ram.rss_bytes, gpu_bytes: gpuUsedBytes(s),
      lead: lead.what, lead_bytes: lead.used_bytes
    };
    this._running = [...this._running, point].slice(-LIVE_POINTS);
  }

  private _setSnapshot(snapshot: ISnapshot): void {
    if (this._snapshot === null || snapshot.time_s >= this._snapshot.time_s) {
      this._snapshot = snapshot;
    }
    const functions = tfCache(snapshot, 'functions');
    if (functions !== null) {
      this._functions = functions;
    }
    this._lastUpdateMs = Date.now();
  }

  private _onEnded(channel: KernelChannel, why: ChannelEnd): void {
    if (channel !== this._channel) {
      return;
    }
    this._closeChannel();
    this._status = 'not-loaded';
    this._snapshot = null;
    if (why === 'closed') {
      this._history = [];
      this._verdict = null;
    }
    this._changed.emit();
  }

  private _onStatus(_: ISessionContext, status: Kernel.Status): void {
    if (GONE.includes(status)) {
      this._cellRunning = false;
      if (this._free.phase === 'queued' || this._free.phase === 'running') {
        this._failFree(`the kernel is ${status}: it did not answer "Free memory"`);
      }
      this._scanner.fail(`the kernel is ${status}: it did not answer the scan`);
      this._closeChannel();
      this._status = 'no-kernel';
    } else if (status === 'idle' && this._status === 'no-kernel') {
      this._restart();
      return;
    } else if (status === 'idle') {
      this._startQueued();
    }
    this._changed.emit();
  }

  /** No cell runs: what waited for it ("Free memory", a scan) runs now, with its deadline. */
  private _startQueued(): void {
    if (this._cellRunning) {
      return;
    }
    this._scanner.kernelIdle();
    if (this._free.phase === 'queued') {
      this._setFree({ ...this._free, phase: 'running' });
    }
  }

  /**
   * Follow whether a cell runs, from its `execute_request`'s busy and idle. The kernel's status
   * alone cannot say: with comms over subshells, each comm request also turns it busy, then
   * idle, while a cell still runs on the main shell (where "Free memory" and scans wait).
   */
  private _followCells(msg: KM.IMessage): void {
    const parent = msg.parent_header;
    if (!KM.isStatusMsg(msg) || !parent || !('msg_type' in parent) ||
      parent.msg_type !== 'execute_request') {
      return;
    }
    const state = msg.content.execution_state;
    if (state === 'busy' || state === 'idle') {
      this._cellRunning = state === 'busy';
      if (!this._cellRunning) {
        this._running = []; // the cell ended (its record came first), or an unrecorded one
        this._startQueued();
        this._changed.emit();
      }
    }
  }

  /** After any execution (`%load_ext` in a cell, the load button) retry a refused kernel. */
  private _onIopub(_: ISessionContext, msg: KM.IMessage): void {
    this._followCells(msg);
    if (
      this._status === 'not-loaded' &&
      KM.isStatusMsg(msg) &&
      msg.content.execution_state === 'idle' &&
      msg.parent_header !== undefined &&
      'msg_type' in msg.parent_header &&
      msg.parent_header.msg_type === 'execute_request'
    ) {
      this._connect();
    }
  }

  /** Fill gaps: refresh a silent kernel, retry a connection that got no answer. */
  private async _tick(): Promise<void> {
    const channel = this._channel;
    if (!channel || this.kernelStatus !== 'idle') {
      return;
    }
    if (!this._active && this._status === 'live') {
      return;
    }
    const now = Date.now();
    if (this._status === 'connecting' && now - this._connectStartedMs > CONNECT_TIMEOUT_MS) {
      this._closeChannel();
      this._connect();
    } else if (this._status === 'live' && now - this._lastUpdateMs > STALE_MS) {
      try {
        const reply = await channel.request('snapshot');
        this._setSnapshot(reply.snapshot);
        this._changed.emit();
      } catch (error) {
        // The channel ended; _onEnded has already updated the status.
      }
    }
  }

  private _session: ISessionContext;
  private _listening: Kernel.IKernelConnection | null = null;
  private _active = false;
  private _running: ILivePoint[] = [];
  private _cellRecorded = new Signal<this, ICellMessage>(this);
  private _historyReceived = new Signal<this, ReadonlyArray<ICellRecord>>(this);
  private _kernelRestarted = new Signal<this, void>(this);
  private _channel: KernelChannel | null = null;
  private _poll: Poll;
  private _status: Status = 'no-notebook';
  private _version = '';
  private _live = false;
  private _snapshot: ISnapshot | null = null;
  private _history: ICellRecord[] = [];
  private _verdict: ILeakVerdict | null = null;
  private _lastOom: ILastOom | null = null;
  private _free: IFreeState = NO_FREE;
  private _cellRunning = false;
  private _scanner = new Scanner(() => this._changed.emit());
  private _freeToken = 0;
  private _freeTimer = 0;
  private _functions: number | null = null;
  private _error = '';
  private _connectStartedMs = 0;
  private _lastUpdateMs = 0;
  private _disposed = false;
  private _changed = new Signal<this, void>(this);
}
