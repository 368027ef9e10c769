/** The one DOM helper the views share: elements built from attributes and children. */

export type Child = Node | string | null;

/** Create an element with attributes and children (text is always text, never HTML). */
export function h(
  tag: string,
  attrs: { [key: string]: string } = {},
  ...children: Child[]
): HTMLElement {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    el.setAttribute(key, value);
  }
  for (const child of children) {
    if (child !== null) {
      el.append(child);
    }
  }
  return el;
}
