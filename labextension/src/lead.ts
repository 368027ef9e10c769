/**
 * The figure every view leads with, as the kernel computes it (`kerasmagic/snapshot.py`):
 * where the Keras backend keeps allocator figures and there is a GPU, its tensors in use
 * against its limit (the memory that runs out; NVML's reservation stays flat once TensorFlow
 * has reserved the card); else this kernel's VRAM (NVML); else its RSS. The headline, the
 * status item, the chart and the badges read it from here. Kernels older than the headline
 * field get it computed the old way.
 */
import { IHeadline, ISnapshot } from './wire';

export type LeadKind = IHeadline['what'];

/** Return this process's VRAM over all GPUs, else the devices' use, else null (as in Python). */
export function gpuUsedBytes(snapshot: ISnapshot): number | null {
  const devices = snapshot.gpu.devices;
  if (devices.length === 0) {
    return null;
  }
  if (devices.every(d => d.process_used_bytes !== null)) {
    return devices.reduce((sum, d) => sum + (d.process_used_bytes ?? 0), 0);
  }
  return devices.reduce((sum, d) => sum + d.used_bytes, 0);
}

/** Return the snapshot's headline (computed as before it was sent, for an older kernel). */
export function leadOf(s: ISnapshot): IHeadline {
  if (s.headline) {
    return s.headline;
  }
  const vram = gpuUsedBytes(s);
  return vram === null
    ? { what: 'rss', label: 'this kernel’s RAM (RSS)', used_bytes: s.ram.rss_bytes,
      limit_bytes: s.ram.total_bytes, limit_label: 'host RAM', reserved_bytes: null }
    : { what: 'vram', label: 'this kernel’s VRAM', used_bytes: vram, limit_bytes: null,
      limit_label: null, reserved_bytes: null };
}

/** Return the figure of kind `what` in a snapshot (a chart keeps one kind across its cells). */
export function figureOf(s: ISnapshot, what: LeadKind): number | null {
  const lead = leadOf(s);
  if (lead.what === what) {
    return lead.used_bytes;
  }
  if (what === 'rss') {
    return s.ram.rss_bytes;
  }
  if (what === 'vram') {
    return gpuUsedBytes(s);
  }
  const backend = s.backends.find(b => b.keras) ?? s.backends[0];
  const counted = backend?.devices.filter(d => d.in_use_bytes !== null) ?? [];
  return counted.length ? counted.reduce((n, d) => n + (d.in_use_bytes ?? 0), 0) : null;
}

/** The short name of a kind, for the status bar and the chart's title. */
export function shortName(lead: IHeadline): string {
  if (lead.what === 'allocator') {
    return lead.label.startsWith('TensorFlow') ? 'TF tensors' : 'Tensors';
  }
  return lead.what === 'vram' ? 'VRAM' : 'RSS';
}
