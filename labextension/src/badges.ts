/**
 * The one-line memory badge under each executed code cell, drawn from the cell's
 * `metadata.kerasmagic` (so a reopened notebook shows its record too) and only
 * while that record belongs to the cell's current execution count.
 */
import { Cell } from '@jupyterlab/cells';
import { NotebookPanel } from '@jupyterlab/notebook';
import { ISignal, Signal } from '@lumino/signaling';
import { MessageLoop } from '@lumino/messaging';
import { PanelLayout, Widget } from '@lumino/widgets';

import { METADATA_KEY, ICellMemory, readCellMemory } from './cellrecord';
import { CodeCellWatcher } from './cellwatch';
import { formatBytes, formatDelta } from './format';
import { backendLabel, oomFigures, oomSummary } from './oom';
import { readOom } from './protocol';

/** The `showCellBadges` setting, shared by every notebook's badges. */
export class BadgeSettings {
  get show(): boolean {
    return this._show;
  }
  set show(value: boolean) {
    if (value !== this._show) {
      this._show = value;
      this._changed.emit();
    }
  }
  get changed(): ISignal<this, void> {
    return this._changed;
  }
  private _show = true;
  private _changed = new Signal<this, void>(this);
}

/** Return the badge's line for a record. */
export function badgeText(m: ICellMemory): string {
  const parts = [
    `RSS ${formatDelta(m.rss_delta_bytes)}`,
    `peak ${formatBytes(m.peak_rss_bytes)}`
  ];
  const tensors = typeof m.tf_delta_bytes === 'number' ? m.tf_delta_bytes : null;
  if (m.lead === 'allocator') {
    // What runs out leads; NVML's reservation (flat once TensorFlow took the card) only moving.
    parts.push(`TF tensors ${formatDelta(tensors)}`);
    if (m.gpu_delta_bytes) {
      parts.push(`GPU reserved ${formatDelta(m.gpu_delta_bytes)}`);
    }
  } else {
    if (m.gpu_delta_bytes !== null) {
      parts.push(`VRAM ${formatDelta(m.gpu_delta_bytes)}`);
    }
    if (tensors !== null && tensors !== 0) {
      parts.push(`TF tensors ${formatDelta(tensors)}`);
    }
  }
  if (m.models_delta) {
    parts.push(`${m.models_delta > 0 ? '+' : '−'}${Math.abs(m.models_delta)} model` +
      (Math.abs(m.models_delta) === 1 ? '' : 's'));
  }
  return parts.join(' · ');
}

class Badge extends Widget {
  constructor() {
    super();
    this.addClass('jp-kerasmagic-cellBadge');
    this.node.dataset.km = 'cell-badge';
  }

  /**
   * Show `memory`, the record of the cell's current run; or, with `previous`, the record of its
   * previous run while the cell runs (or waits to run) again, marked as such; or nothing.
   */
  render(memory: ICellMemory | null, previous = false): void {
    this.setHidden(memory === null);
    if (memory === null) {
      return;
    }
    const d = this.node.dataset;
    d.state = previous ? 'previous' : 'current';
    this.toggleClass('jp-mod-previous', previous);
    d.executionCount = String(memory.execution_count);
    d.rssDelta = String(memory.rss_delta_bytes ?? '');
    d.peakRss = String(memory.peak_rss_bytes);
    d.gpuDelta = String(memory.gpu_delta_bytes ?? '');
    d.tfDelta = String(memory.tf_delta_bytes ?? '');
    d.modelsDelta = String(memory.models_delta ?? '');
    d.warning = memory.warning ? 'true' : 'false';
    const oom = readOom(memory.oom);
    d.oom = oom ? 'true' : 'false';
    d.oomWanted = String(oom?.wanted_bytes ?? '');
    d.oomDevice = oom?.device ?? '';
    const text = (previous ? `previous run [${memory.execution_count}]: ` : '') + badgeText(memory);
    const children: (Node | string)[] = [text];
    if (oom) {
      const mark = document.createElement('span');
      mark.className = 'jp-kerasmagic-cellBadge-oom';
      mark.textContent = `✖ ${oomSummary(oom)} — remedy: ${oom.remedy}`;
      children.push(' · ', mark);
    }
    if (memory.warning) {
      const mark = document.createElement('span');
      mark.className = 'jp-kerasmagic-cellBadge-warn';
      mark.textContent = '⚠ grows per run';
      children.push(' · ', mark);
    }
    this.node.replaceChildren(...children);
    this.node.title = (previous ? 'The cell runs again; until it ends, these are its previous run’s figures. ' : '') +
      `kerasmagic, cell [${memory.execution_count}] (${memory.duration_s.toFixed(1)} s): ` +
      `RSS ${formatDelta(memory.rss_delta_bytes)} to ${formatBytes(memory.rss_bytes)}, ` +
      `in-cell peak ${formatBytes(memory.peak_rss_bytes)}` +
      (memory.gpu_bytes !== null ? `; VRAM ${formatDelta(memory.gpu_delta_bytes)} to ${formatBytes(memory.gpu_bytes)}` : '') +
      (typeof memory.tf_delta_bytes === 'number' && typeof memory.tf_bytes === 'number'
        ? `; TensorFlow tensors ${formatDelta(memory.tf_delta_bytes)} to ${formatBytes(memory.tf_bytes)}`
        : '') +
      (memory.models_delta !== null ? `; Keras models named in the notebook ${memory.models_delta >= 0 ? '+' : ''}${memory.models_delta}` : '') +
      (oom ? `\n✖ ${oomSummary(oom)} (${backendLabel(oom.backend)})` +
        (oomFigures(oom) ? `; allocator ${oomFigures(oom)}` : '') + `. Remedy: ${oom.remedy}` : '') +
      (memory.warning ? `\n⚠ ${memory.warning}` : '');
    this.node.setAttribute('aria-label', this.node.title);
  }
}

/** Keeps a badge under every code cell of one notebook in step with its record. */
export class CellBadges extends CodeCellWatcher {
  constructor(panel: NotebookPanel, settings: BadgeSettings) {
    super(panel);
    this._settings = settings;
    settings.changed.connect(this.visitAll, this);
  }

  protected onCell(cell: Cell): void {
    this._update(cell);
  }

  private _update(cell: Cell): void {
    let badge = this._badges.get(cell);
    if (badge === undefined) {
      badge = new Badge();
      this._badges.set(cell, badge);
      (cell.layout as PanelLayout).addWidget(badge);
      // A code cell's layout re-inserts its children on attach around the output wrapper, and
      // a badge added before the cell was first attached can land on top: keep it last.
      const last = badge;
      MessageLoop.installMessageHook(cell, (_, msg) => {
        if (msg.type === 'after-attach' && last.node.nextElementSibling !== null) {
          cell.node.appendChild(last.node);
        }
        return true;
      });
      const again = (): void => {
        if (!cell.isDisposed) {
          this._update(cell);
        }
      };
      cell.model.metadataChanged.connect(again, this);
      // A re-run clears the count without a signal (a silent change): its running state says it.
      cell.model.stateChanged.connect(
        (_, change) => (change.name === 'executionCount' || change.name === 'executionState') && again(), this);
    }
    const memory = this._settings.show ? readCellMemory(cell.model.getMetadata(METADATA_KEY)) : null;
    const model = cell.model as { executionCount?: number | null; executionState?: string };
    const current = model.executionCount ?? null;
    if (badge.node.nextElementSibling !== null && badge.node.parentElement === cell.node) {
      cell.node.appendChild(badge.node);
    }
    if (model.executionState === 'running') {
      // Running or queued again: a record that was shown is the previous run's until the new one.
      badge.render(memory !== null && this._shown.get(cell) === memory.execution_count ? memory : null, true);
    } else {
      const shown = memory !== null && memory.execution_count === current ? memory : null;
      this._shown.set(cell, shown?.execution_count ?? null);
      badge.render(shown);
    }
  }

  private _settings: BadgeSettings;
  private _badges = new WeakMap<Cell, Badge>();
  /** The execution count of the record each cell's badge showed as current when it last ran. */
  private _shown = new WeakMap<Cell, number | null>();
}
