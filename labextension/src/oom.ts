/**
 * An out-of-memory error in words, as the cell's badge and the panel say it (the kernel's
 * printed block, kerasmagic/oom/explain.py, says the same).
 */
import { formatBytes } from './format';
import { IOomFacts } from './protocol';
import { BACKEND_LABELS } from './wire';

/** Return the backend's name as users know it (kerasmagic.backends.LABELS). */
export function backendLabel(backend: string): string {
  return BACKEND_LABELS[backend] ?? backend;
}

/** `out of memory: wanted 133.5 MB on CPU:0` (what failed, where). */
export function oomSummary(o: IOomFacts): string {
  const wanted = o.wanted_bytes !== null ? `: wanted ${formatBytes(o.wanted_bytes)}` : '';
  const where = o.device ? ` on ${o.device}` : '';
  return `out of memory${wanted}${where}` + (o.isolated ? ' (isolated process)' : '');
}

/** `in use 15.3 MB, peak 64.0 MB, limit 160.0 MB (TF_CPU_BFC_MEM_LIMIT_IN_MB)`, or ''. */
export function oomFigures(o: IOomFacts): string {
  const limit = o.limit_bytes !== null
    ? `limit ${formatBytes(o.limit_bytes)}` + (o.limit_source ? ` (${o.limit_source})` : '') : '';
  return [
    o.in_use_bytes !== null ? `in use ${formatBytes(o.in_use_bytes)}` : '',
    o.peak_bytes !== null ? `peak ${formatBytes(o.peak_bytes)}` : '',
    limit
  ].filter(Boolean).join(', ');
}
