/**
 * "What holds memory": one kernel's on-demand scan (every live Keras model with
 * its holders, and the largest data), its phase and its deadline. The kernel
 * runs a scan between cells, so it waits for a running cell. No DOM here.
 */
import { PageConfig } from '@jupyterlab/coreutils';

import { ILiveModel, IVariable } from './protocol';
import { KernelChannel } from './request';

export interface IScanState {
  phase: 'idle' | 'queued' | 'running' | 'done' | 'failed';
  models: ReadonlyArray<ILiveModel>;
  variables: ReadonlyArray<IVariable>;
  /** How many of the live models are named in the notebook (null: an older kernel). */
  namedModels: number | null;
  /** Why the scan failed, or ''. */
  error: string;
  /** When the answer arrived (ms since the epoch), or null. */
  atMs: number | null;
  /** Whether a cell ran or memory was freed after the scan (its rows may be out of date). */
  stale: boolean;
}

const NO_SCAN: IScanState = {
  phase: 'idle',
  models: [],
  variables: [],
  namedModels: null,
  error: '',
  atMs: null,
  stale: false
};

/** How long a scan may run without an answer (page config `kerasmagicScanTimeoutMs`). */
function scanTimeoutMs(): number {
  const configured = Number(PageConfig.getOption('kerasmagicScanTimeoutMs'));
  return configured > 0 ? configured : 60000;
}

export class Scanner {
  /** `changed` is called on every change the view shows. */
  constructor(changed: () => void) {
    this._changed = changed;
  }

  get state(): IScanState {
    return this._state;
  }

  /** Whether a scan is queued or running (the button is off meanwhile). */
  get pending(): boolean {
    return this._state.phase === 'queued' || this._state.phase === 'running';
  }

  /** Ask the kernel what holds memory; `busy`: a cell runs, so the kernel answers after it. */
  async scan(channel: KernelChannel | null, busy: boolean): Promise<void> {
    if (channel === null || this.pending) {
      return;
    }
    const token = ++this._token;
    this._set({ ...this._state, phase: busy ? 'queued' : 'running', error: '' });
    try {
      const reply = await channel.request('scan');
      if (token === this._token) {
        this._set({
          phase: 'done',
          models: reply.models,
          variables: reply.variables,
          namedModels: reply.named_models ?? null,
          error: '',
          atMs: Date.now(),
          stale: false
        });
      }
    } catch (error) {
      if (token === this._token) {
        this.fail(error instanceof Error ? error.message : String(error));
      }
    }
  }

  /** The kernel went idle: a queued scan runs now, and its deadline starts. */
  kernelIdle(): void {
    if (this._state.phase === 'queued') {
      this._set({ ...this._state, phase: 'running' });
    }
  }

  /** End a pending scan (a late answer is ignored) and say why; the last rows stay. */
  fail(why: string): void {
    if (!this.pending) {
      return;
    }
    this._token++;
    this._set({ ...this._state, phase: 'failed', error: why });
  }

  /** A cell ran or memory was freed: the rows shown are from before it. */
  markStale(): void {
    if (this._state.phase === 'done' && !this._state.stale) {
      this._set({ ...this._state, stale: true });
    }
  }

  /** Another kernel: forget this one's rows (a failure's message stays, as for "Free memory"). */
  reset(): void {
    if (this._state.phase !== 'failed') {
      this._token++;
      this._set(NO_SCAN);
    }
  }

  dispose(): void {
    this._token++;
    window.clearTimeout(this._timer);
  }

  private _set(state: IScanState): void {
    this._state = state;
    window.clearTimeout(this._timer);
    if (state.phase === 'running') {
      const token = this._token;
      const ms = scanTimeoutMs();
      this._timer = window.setTimeout(() => {
        if (token === this._token && this._state.phase === 'running') {
          this.fail(`no answer from the kernel within ${Math.round(ms / 1000)} s`);
        }
      }, ms);
    }
    this._changed();
  }

  private _changed: () => void;
  private _state: IScanState = NO_SCAN;
  private _token = 0;
  private _timer = 0;
}
