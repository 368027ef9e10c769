/** Number formatting shared by the panel and the status bar (as kerasmagic/views/render.py). */

/** Return `n` bytes as a short human figure (`1.2 GB`); `n/a` for null. */
export function formatBytes(n: number | null): string {
  if (n === null) {
    return 'n/a';
  }
  const sign = n < 0 ? '-' : '';
  let value = Math.abs(n);
  for (const unit of ['B', 'KB', 'MB', 'GB']) {
    if (value < 1024) {
      return unit === 'B' ? `${sign}${value.toFixed(0)} B` : `${sign}${value.toFixed(1)} ${unit}`;
    }
    value /= 1024;
  }
  return `${sign}${value.toFixed(1)} TB`;
}

/** Return a signed figure (`+12.0 MB`, `-3.1 MB`). */
export function formatDelta(n: number | null): string {
  if (n === null) {
    return 'n/a';
  }
  return n > 0 ? `+${formatBytes(n)}` : formatBytes(n);
}

/** Return `part / whole` as a percentage clamped to 0..100 (0 when whole is 0). */
export function percent(part: number, whole: number): number {
  return whole > 0 ? Math.max(0, Math.min(100, (100 * part) / whole)) : 0;
}
