/**
 * One comm to one kernel's `kerasmagic` target: open it, send typed requests,
 * route replies to their promises and pushes to a signal. No UI state here.
 */
import { Kernel, KernelMessage as KM } from '@jupyterlab/services';
import { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';

import {
  IErrorMessage,
  Push,
  PROTOCOL,
  ReplyFor,
  RequestType,
  TARGET,
  parseKernelMessage
} from './protocol';

interface IPending {
  resolve: (reply: ReplyFor<RequestType>) => void;
  reject: (error: Error) => void;
}

/** Why a channel ended: the kernel refused it (kerasmagic not loaded) or closed it later. */
export type ChannelEnd = 'refused' | 'closed';

export class KernelChannel implements IDisposable {
  /**
   * Open a comm to `kernel`'s kerasmagic target and say hello; or, given the comm the kernel
   * opened itself (`%load_ext` announces one: its messages come on iopub, while a hello this
   * page sends waits behind every queued cell of Run All), take it with its opening message.
   */
  constructor(kernel: Kernel.IKernelConnection, opened?: [Kernel.IComm, KM.ICommOpenMsg]) {
    this.kernel = kernel;
    this._comm = opened ? opened[0] : kernel.createComm(TARGET);
    this._comm.onMsg = msg => this._onMsg(msg);
    this._comm.onClose = () => this._end(this._accepted ? 'closed' : 'refused');
    if (opened) {
      // Its data is the kernel's `state`: given once the owner listens to `pushed`.
      void Promise.resolve().then(() => this._disposed || this._onMsg(opened[1]));
      return;
    }
    this._comm
      .open({ protocol: PROTOCOL, type: 'hello' })
      .done.catch(() => this._end('closed'));
  }

  readonly kernel: Kernel.IKernelConnection;

  /** State, samples and cell records the kernel pushes. */
  get pushed(): ISignal<this, Push> {
    return this._pushed;
  }

  /** Emitted once when the kernel refuses or closes the comm. */
  get ended(): ISignal<this, ChannelEnd> {
    return this._ended;
  }

  /** Errors the kernel sent that answer no pending request. */
  get errors(): ISignal<this, IErrorMessage> {
    return this._errors;
  }

  /** Whether the kernel has answered the hello (kerasmagic is loaded). */
  get accepted(): boolean {
    return this._accepted;
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  /** Send a request; resolve with the kernel's reply (queued by the kernel while it is busy). */
  request<K extends RequestType>(type: K): Promise<ReplyFor<K>> {
    if (this._disposed || this._comm.isDisposed) {
      return Promise.reject(new Error('the kernel connection is closed'));
    }
    const id = `${type}-${++this._counter}`;
    return new Promise<ReplyFor<K>>((resolve, reject) => {
      this._pending.set(id, {
        resolve: reply => resolve(reply as ReplyFor<K>),
        reject
      });
      this._comm.send({ protocol: PROTOCOL, type, id });
    });
  }

  /**
   * Close the comm (if still open) and reject every pending request.
   *
   * A comm the kernel has not answered yet is left registered: the kernel will still answer
   * its open (a refusal closes it, and a close for a comm the connection no longer knows is
   * logged as an error), so it is closed only once that answer arrives.
   */
  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    if (!this._endedOnce && !this._comm.isDisposed && !this.kernel.isDisposed) {
      if (this._accepted) {
        this._closeComm();
      } else {
        this._comm.onMsg = () => this._closeComm();
        this._comm.onClose = () => undefined;
      }
    }
    this._rejectAll('the kernel connection was closed');
    Signal.clearData(this);
  }

  private _closeComm(): void {
    if (this._comm.isDisposed || this.kernel.isDisposed) {
      return;
    }
    try {
      this._comm.close();
    } catch (error) {
      // The kernel went away first: there is nothing left to close.
    }
  }

  private _onMsg(msg: KM.ICommMsgMsg | KM.ICommOpenMsg): void {
    const message = parseKernelMessage(msg.content.data);
    if (message === null) {
      console.warn('kerasmagic: ignoring a message this frontend does not understand', msg);
      return;
    }
    if (message.type === 'reply' || (message.type === 'error' && message.id !== null)) {
      const pending = this._pending.get(message.id ?? '');
      if (pending !== undefined) {
        this._pending.delete(message.id ?? '');
        if (message.type === 'reply') {
          pending.resolve(message);
        } else {
          pending.reject(new Error(message.error));
        }
        return;
      }
    }
    if (message.type === 'error') {
      this._errors.emit(message);
      return;
    }
    if (message.type === 'reply') {
      return;
    }
    if (message.type === 'state') {
      this._accepted = true;
    }
    this._pushed.emit(message);
  }

  private _end(why: ChannelEnd): void {
    if (this._endedOnce || this._disposed) {
      return;
    }
    this._endedOnce = true;
    this._rejectAll('the kernel closed the kerasmagic connection');
    this._ended.emit(why);
  }

  private _rejectAll(why: string): void {
    for (const pending of this._pending.values()) {
      pending.reject(new Error(why));
    }
    this._pending.clear();
  }

  private _comm: Kernel.IComm;
  private _accepted = false;
  private _counter = 0;
  private _disposed = false;
  private _endedOnce = false;
  private _pending = new Map<string, IPending>();
  private _pushed = new Signal<this, Push>(this);
  private _ended = new Signal<this, ChannelEnd>(this);
  private _errors = new Signal<this, IErrorMessage>(this);
}
