// The dashboard's one rich text path: a safe subset of CommonMark (+ GFM tables and
// autolinks) as agents write it, rendered to DOM nodes.
//
// Supported: paragraphs, ATX and setext headings, emphasis and strong (`*`, `_`),
// inline code, fenced code blocks (the info string's language only as a label),
// bullet and numbered lists nested by indent, block quotes, horizontal rules, GFM pipe
// tables, links `[text](url "title")`, `<scheme:...>` autolinks and bare http(s) URLs,
// backslash escapes and hard line breaks. Not supported (shown as text): raw HTML,
// entities, reference links, indented code blocks, footnotes, task list boxes.
//
// Safety, by construction rather than by filtering:
// - nodes are made with `document.createElement` and text goes in as text nodes
//   (`text()`): there is no HTML parser on this path, so `<script>` or `<img onerror>`
//   in the source is shown as the characters it is;
// - attributes are only `href`, `title`, `rel`, `target`, `start`, `class` and
//   `data-*`, set with constant names;
// - a link gets an `href` only when its URL, trimmed and without control characters,
//   parses as http: or https: (case-insensitive); it gets rel="noopener noreferrer" and
//   target="_blank". Any other scheme (javascript:, data:, vbscript:, file:, relative)
//   is shown as inert text beside the link's text;
// - no image is loaded: `![alt](url)` shows its alt text and its URL as text;
// - control characters and invisible format characters are shown escaped, as the rest
//   of the page shows them (`text()`);
// - every loop is bounded: nesting depth of blocks and emphasis is capped, delimiter
//   runs are matched with CommonMark's openers-bottom rule, link tails are scanned at
//   most LINK_SCAN characters, and no regular expression can backtrack more than
//   linearly, so a hostile 1 MB line renders in time linear in its length.
//
// Exports: `markdown(text) -> HTMLDivElement` (a `div.md`), and
// `renderMarkdown(el, text)`, which re-renders into `el` reusing the nodes of the
// top-level blocks whose source did not change (a streaming reply re-renders only its
// last block each frame).

import { inert, text } from "/lib/dom.js";

// The inert-text rule's characters (`lib/dom.js`), removed from a URL before its scheme
// is read.
const CTL_CHARS =
  "\\x00-\\x08\\x0b-\\x1f\\x7f-\\x9f\\u00ad\\u061c\\u180e\\u200b-\\u200f\\u2028-\\u202e\\u2060-\\u2064\\u2066-\\u2069\\ufeff";

/** An element with a class (optional) and children (strings go in through `text()`). */
function el(tag, cls, ...children) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  for (const c of children) {
    if (c == null) continue;
    e.append(c instanceof Node ? c : text(c));
  }
  return e;
}

const MAX_DEPTH = 12; // block nesting (quotes, lists) and emphasis nesting
const MAX_RUN = 8; // a longer `*`/`_` run is text, not emphasis
const LINK_SCAN = 2048; // the longest link tail `(url "title")` looked at
const MAX_COLUMNS = 64;

// ---------------------------------------------------------------------------------
// Links: the only attribute that could carry behaviour is `href`, given only to
// http(s) URLs.

// Control characters, C1, and the invisible format characters of `CTL`, plus space.
const URL_STRIP = new RegExp("[\\s\\x00-\\x1f" + CTL_CHARS + "]", "g");

/** The URL `raw` as a safe http(s) href, or null. */
export function safeHref(raw) {
  const s = String(raw ?? "").replace(URL_STRIP, "");
  if (!/^https?:/i.test(s)) return null;
  let u;
  try {
    u = new URL(s);
  } catch {
    return null;
  }
  if (u.protocol !== "http:" && u.protocol !== "https:") return null;
  return u.href;
}

/** A link to `url` showing `content` (nodes), or the content and the URL as inert text. */
function linkNode(url, title, fill) {
  const href = safeHref(url);
  if (href) {
    const a = document.createElement("a");
    a.setAttribute("href", href);
    a.setAttribute("rel", "noopener noreferrer");
    a.setAttribute("target", "_blank");
    if (title) a.setAttribute("title", inert(title));
    fill(a);
    return a;
  }
  const span = el("span", "md-inert-link");
  fill(span);
  if (span.textContent !== url) span.append(" ", el("span", "md-url", "(" + url + ")"));
  return span;
}

// ---------------------------------------------------------------------------------
// Inline: code spans, escapes, links, autolinks, emphasis, hard breaks.

const PUNCT = /[!-/:-@[-`{-~\u00a1-\u00bf\u2010-\u2027\u2030-\u205e]/;
const isSpace = (c) => c === undefined || c === " " || c === "\t" || c === "\n" || c === "\r" || c === "\u00a0";
const isPunct = (c) => c !== undefined && PUNCT.test(c);
const SPECIAL = /[\\`*_!\[<hH\n]/g;
const ESCAPABLE = /[!-/:-@[-`{-~]/;
const BARE_URL = /https?:\/\//iy;

function unescape(s) {
  return s.replace(/\\([!-/:-@[-`{-~])/g, "$1");
}

/** Where each `[` of `s` closes (escaped brackets skipped): `pairs[open]` is close + 1, or 0. */
function bracketPairs(s) {
  const pairs = new Int32Array(s.length);
  const stack = [];
  for (let i = 0; i < s.length; i++) {
    const c = s[i];
    if (c === "\\") i++;
    else if (c === "[") stack.push(i);
    else if (c === "]" && stack.length) pairs[stack.pop()] = i + 1;
  }
  return pairs;
}

/** The positions of the backtick runs of `s`, by run length. */
function backtickRuns(s) {
  const runs = new Map();
  for (let i = 0; i < s.length; ) {
    if (s[i] !== "`") {
      const j = s.indexOf("`", i);
      if (j < 0) break;
      i = j;
      continue;
    }
    let j = i;
    while (s[j] === "`") j++;
    const len = j - i;
    if (!runs.has(len)) runs.set(len, { at: [], next: 0 });
    runs.get(len).at.push(i);
    i = j;
  }
  return runs;
}

let scanned = 0; // how far the last `linkTail` looked

/** `(dest "title")` after a `]` at `k` (the `(`): {dest, title, end} or null. */
function linkTail(s, k) {
  scanned = 1;
  if (s[k] !== "(") return null;
  const limit = Math.min(s.length, k + LINK_SCAN);
  let i = k + 1;
  const fail = () => {
    scanned = i - k;
    return null;
  };
  const skip = () => {
    while (i < limit && (s[i] === " " || s[i] === "\t" || s[i] === "\n")) i++;
  };
  skip();
  let dest = "";
  if (s[i] === "<") {
    const start = ++i;
    while (i < limit && s[i] !== ">" && s[i] !== "\n" && s[i] !== "<") i += s[i] === "\\" ? 2 : 1;
    if (s[i] !== ">") return fail();
    dest = s.slice(start, i++);
  } else {
    const start = i;
    let depth = 0;
    while (i < limit) {
      const c = s[i];
      if (c === "\\" && i + 1 < limit) {
        i += 2;
        continue;
      }
      if (c === " " || c === "\t" || c === "\n") break;
      if (c === "(") {
        if (++depth > 32) return fail(); // CommonMark's limit
      } else if (c === ")") {
        if (depth === 0) break;
        depth--;
      }
      i++;
    }
    if (i >= limit) return fail();
    dest = s.slice(start, i);
  }
  skip();
  let title = "";
  const q = s[i];
  if (q === '"' || q === "'" || (q === "(" && dest)) {
    const close = q === "(" ? ")" : q;
    const start = ++i;
    while (i < limit && s[i] !== close) i += s[i] === "\\" ? 2 : 1;
    if (i >= limit) return fail();
    title = unescape(s.slice(start, i++));
    skip();
  }
  if (s[i] !== ")") return fail();
  scanned = i - k;
  return { dest: unescape(dest), title, end: i + 1 };
}

/** The end of a bare http(s) URL starting at `i`, GFM's extended autolink rule. */
function bareUrlEnd(s, i) {
  let j = i;
  let open = 0;
  let close = 0;
  while (j < s.length && !isSpace(s[j]) && s[j] !== "<") {
    if (s[j] === "(") open++;
    else if (s[j] === ")") close++;
    j++;
  }
  // Trailing punctuation is the sentence's, and a `)` only when unbalanced.
  for (;;) {
    const c = s[j - 1];
    if ("?!.,:*_~'\";".includes(c)) j--;
    else if (c === ")" && close > open) {
      j--;
      close--;
    } else break;
  }
  return j;
}

/** Appends the inline content of `s` to `out`. */
function inline(out, s, depth, inLink) {
  if (depth > MAX_DEPTH) {
    out.append(text(s));
    return;
  }
  const delims = [];
  let pairs = null;
  let runs = null;
  let last = 0;
  let i = 0;
  // Failed link tails are scanned again from each `[`: their total is bounded.
  let budget = 8 * s.length + 10000;
  const flush = (to) => {
    if (to > last) out.append(text(s.slice(last, to)));
  };
  SPECIAL.lastIndex = 0;
  for (;;) {
    SPECIAL.lastIndex = i;
    const m = SPECIAL.exec(s);
    if (!m) break;
    i = m.index;
    const c = s[i];
    if (c === "\\") {
      const n = s[i + 1];
      if (n === "\n") {
        flush(i);
        out.append(document.createElement("br"));
        i += 2;
        last = i;
      } else if (n !== undefined && ESCAPABLE.test(n)) {
        flush(i);
        last = i + 1; // the escaped character starts the next text
        i += 2;
      } else i++;
    } else if (c === "`") {
      let j = i;
      while (s[j] === "`") j++;
      const len = j - i;
      runs ??= backtickRuns(s);
      const r = runs.get(len);
      while (r && r.next < r.at.length && r.at[r.next] <= i) r.next++;
      if (r && r.next < r.at.length) {
        const close = r.at[r.next];
        flush(i);
        let code = s.slice(j, close).replace(/\n/g, " ");
        if (code.length > 2 && code[0] === " " && code[code.length - 1] === " " && code.trim()) code = code.slice(1, -1);
        out.append(el("code", null, code));
        i = close + len;
        last = i;
      } else i = j;
    } else if (c === "*" || c === "_") {
      let j = i;
      while (s[j] === c) j++;
      const len = j - i;
      const before = s[i - 1];
      const after = s[j];
      const left = !isSpace(after) && (!isPunct(after) || isSpace(before) || isPunct(before));
      const right = !isSpace(before) && (!isPunct(before) || isSpace(after) || isPunct(after));
      const canOpen = c === "*" ? left : left && (!right || isPunct(before));
      const canClose = c === "*" ? right : right && (!left || isPunct(after));
      if (len <= MAX_RUN && (canOpen || canClose)) {
        flush(i);
        const node = document.createTextNode(s.slice(i, j));
        out.append(node);
        delims.push({ node, ch: c, count: len, orig: len, canOpen, canClose, gap: 0, prev: null, next: null });
        last = j;
      }
      i = j;
    } else if (c === "!" || c === "[") {
      const open = c === "!" ? i + 1 : i;
      if (s[open] !== "[" || inLink) {
        i++;
        continue;
      }
      pairs ??= bracketPairs(s);
      const close = pairs[open] - 1;
      const tail = close < 0 || budget <= 0 ? null : linkTail(s, close + 1);
      if (close >= 0) budget -= scanned;
      if (!tail) {
        i = open + 1;
        continue;
      }
      flush(i);
      const label = s.slice(open + 1, close);
      if (c === "!") {
        // No image is loaded: its alt text and its URL, as text.
        out.append(el("span", "md-image", "[image: " + unescape(label) + "] ", el("span", "md-url", tail.dest)));
      } else {
        const node = linkNode(tail.dest, tail.title, (a) => inline(a, label, depth + 1, true));
        out.append(node);
        // The link nests its text's emphasis: an emphasis around it is deeper still.
        if (delims.length) {
          const d = delims[delims.length - 1];
          d.gap = Math.max(d.gap, 1 + nested(node));
        }
      }
      i = tail.end;
      last = i;
    } else if (c === "<") {
      // <scheme:...>: a link when http(s), else the characters as they are.
      let j = i + 1;
      while (j < s.length && j - i < 34 && /[A-Za-z0-9+.-]/.test(s[j])) j++;
      if (j > i + 2 && /[A-Za-z]/.test(s[i + 1]) && s[j] === ":" && !inLink) {
        let k = j + 1;
        while (k < s.length && s[k] !== ">" && s[k] !== "<" && !isSpace(s[k])) k++;
        if (s[k] === ">") {
          const url = s.slice(i + 1, k);
          if (safeHref(url)) {
            flush(i);
            out.append(linkNode(url, "", (a) => a.append(text(url))));
            i = k + 1;
            last = i;
            continue;
          }
        }
      }
      i++;
    } else if (c === "h" || c === "H") {
      const before = s[i - 1];
      if (!inLink && (isSpace(before) || "(*_~\"'".includes(before))) {
        BARE_URL.lastIndex = i;
        const head = BARE_URL.exec(s);
        if (head) {
          const end = bareUrlEnd(s, i);
          const url = s.slice(i, end);
          if (end > i + head[0].length && safeHref(url)) {
            flush(i);
            out.append(linkNode(url, "", (a) => a.append(text(url))));
            last = end;
          }
          // Not a URL: all of it is text (not scanned again from each `http` inside).
          i = Math.max(end, i + 1);
          continue;
        }
      }
      i++;
    } else {
      // A newline: a hard break after two spaces, else a soft one (kept as is).
      let k = i;
      while (k > last && s[k - 1] === " ") k--;
      if (i - k >= 2) {
        flush(k);
        out.append(document.createElement("br"));
        last = i + 1;
      }
      i++;
    }
  }
  flush(s.length);
  emphasis(delims, depth);
}

/** How deeply emphasis nests inside `node` (a link's content, at most MAX_DEPTH). */
function nested(node) {
  let d = 0;
  for (let n = node.firstElementChild; n; n = n.nextElementSibling) {
    if (n.tagName === "EM" || n.tagName === "STRONG") d = Math.max(d, 1 + nested(n));
  }
  return d;
}

/**
 * Matches the `*`/`_` delimiter runs of one inline (CommonMark's "process emphasis",
 * with its openers-bottom rule so that unmatched runs are not searched again): the
 * nodes between a matched opener and closer move into an `em` or `strong`.
 *
 * Each delimiter keeps `gap`, the deepest element between it and the next delimiter,
 * so the nesting depth of a new wrapper is known from the delimiters the opener search
 * walked anyway; a match that would nest deeper than MAX_DEPTH is left as text.
 */
function emphasis(list, depth) {
  for (let k = 0; k < list.length; k++) {
    list[k].prev = list[k - 1] || null;
    list[k].next = list[k + 1] || null;
  }
  const remove = (d) => {
    if (d.prev) {
      d.prev.next = d.next;
      d.prev.gap = Math.max(d.prev.gap, d.gap);
    }
    if (d.next) d.next.prev = d.prev;
  };
  const bottom = new Map();
  let closer = list[0] || null;
  while (closer) {
    if (!closer.canClose) {
      closer = closer.next;
      continue;
    }
    const key = closer.ch + (closer.canOpen ? "1" : "0") + (closer.orig % 3);
    const floor = bottom.get(key);
    let opener = closer.prev;
    let inner = 0; // the deepest element between `opener` and `closer`
    while (opener && opener !== floor) {
      inner = Math.max(inner, opener.gap);
      const odd = (opener.canClose || closer.canOpen) && (opener.orig + closer.orig) % 3 === 0 &&
        !(opener.orig % 3 === 0 && closer.orig % 3 === 0);
      if (opener.ch === closer.ch && opener.canOpen && !odd) break;
      opener = opener.prev;
    }
    if (!opener || opener === floor || depth + inner + 1 > MAX_DEPTH) {
      // Unmatched (or too deep: an earlier opener would nest deeper still).
      bottom.set(key, closer.prev);
      const next = closer.next;
      if (!closer.canOpen) remove(closer);
      closer = next;
      continue;
    }
    const use = opener.count >= 2 && closer.count >= 2 ? 2 : 1;
    const wrap = document.createElement(use === 2 ? "strong" : "em");
    while (opener.node.nextSibling && opener.node.nextSibling !== closer.node) wrap.append(opener.node.nextSibling);
    opener.node.after(wrap);
    for (let x = opener.next; x && x !== closer; x = x.next) remove(x);
    opener.gap = inner + 1;
    opener.count -= use;
    closer.count -= use;
    opener.node.data = opener.ch.repeat(opener.count);
    closer.node.data = closer.ch.repeat(closer.count);
    if (opener.count === 0) {
      opener.node.remove();
      remove(opener);
    }
    if (closer.count === 0) {
      closer.node.remove();
      const next = closer.next;
      remove(closer);
      closer = next;
    }
  }
}

// ---------------------------------------------------------------------------------
// Blocks: a line-based parser into plain objects, then nodes.

/** Leading spaces of `line` (tabs count to the next multiple of 4). */
function indentOf(line) {
  let n = 0;
  for (const c of line) {
    if (c === " ") n++;
    else if (c === "\t") n += 4 - (n % 4);
    else break;
  }
  return n;
}

/** `line` without its first `n` columns of indentation. */
function dedent(line, n) {
  let col = 0;
  let i = 0;
  while (i < line.length && col < n) {
    if (line[i] === " ") col++;
    else if (line[i] === "\t") col += 4 - (col % 4);
    else break;
    i++;
  }
  return (col > n ? " ".repeat(col - n) : "") + line.slice(i);
}

const isBlank = (line) => line.trim() === "";

function fenceOpen(line) {
  const m = /^( {0,3})(`{3,}|~{3,})/.exec(line);
  if (!m) return null;
  const info = line.slice(m[0].length).trim();
  if (m[2][0] === "`" && info.includes("`")) return null;
  return { indent: m[1].length, ch: m[2][0], len: m[2].length, info };
}

function isFenceClose(line, f) {
  if (indentOf(line) > 3) return false;
  const t = line.trim();
  if (t.length < f.len || t[0] !== f.ch) return false;
  for (const c of t) if (c !== f.ch) return false;
  return true;
}

function heading(line) {
  const m = /^ {0,3}(#{1,6})(?=[ \t]|$)/.exec(line);
  if (!m) return null;
  let t = line.slice(m[0].length).trim();
  // A closing run of `#` preceded by a space is not content.
  let e = t.length;
  while (e > 0 && t[e - 1] === "#") e--;
  if (e === 0) t = "";
  else if (e < t.length && (t[e - 1] === " " || t[e - 1] === "\t")) t = t.slice(0, e).trim();
  return { level: m[1].length, text: t };
}

function isRule(line) {
  if (indentOf(line) > 3) return false;
  const t = line.trim();
  const c = t[0];
  if (c !== "-" && c !== "*" && c !== "_") return false;
  let n = 0;
  for (const x of t) {
    if (x === c) n++;
    else if (x !== " " && x !== "\t") return false;
  }
  return n >= 3;
}

function listMarker(line) {
  const m = /^( {0,3})([-*+]|\d{1,9}[.)])([ \t]+|$)/.exec(line);
  if (!m) return null;
  const ordered = m[2].length > 1 || /\d/.test(m[2]);
  const rest = line.slice(m[0].length);
  const spaces = indentOf(m[3]);
  // Content starts after the marker and its spaces (one when there are five or more).
  const pad = rest === "" || spaces > 4 ? 1 : spaces;
  return {
    ordered,
    kind: ordered ? m[2].slice(-1) : m[2],
    start: ordered ? parseInt(m[2], 10) : 1,
    offset: m[1].length + m[2].length + pad,
    empty: rest.trim() === "",
    rest,
  };
}

const isQuote = (line) => /^ {0,3}>/.test(line);

function splitRow(line) {
  let t = line.trim();
  if (t.startsWith("|")) t = t.slice(1);
  if (t.endsWith("|") && !t.endsWith("\\|")) t = t.slice(0, -1);
  const cells = [];
  let cur = "";
  for (let i = 0; i < t.length; i++) {
    if (t[i] === "\\" && t[i + 1] === "|") {
      cur += "|";
      i++;
    } else if (t[i] === "|") {
      cells.push(cur.trim());
      cur = "";
      if (cells.length > MAX_COLUMNS) break;
    } else cur += t[i];
  }
  cells.push(cur.trim());
  return cells;
}

/** The alignments of a GFM delimiter row, or null when `line` is not one. */
function delimiterRow(line) {
  if (!line.includes("-") || !/^[ \t|:-]+$/.test(line)) return null;
  const cells = splitRow(line);
  const align = [];
  for (const c of cells) {
    if (!/^:?-+:?$/.test(c)) return null;
    align.push(c.endsWith(":") ? (c.startsWith(":") ? "center" : "right") : c.startsWith(":") ? "left" : "");
  }
  return align;
}

function tableStart(lines, i) {
  if (!lines[i].includes("|") || i + 1 >= lines.length) return null;
  const align = delimiterRow(lines[i + 1]);
  if (!align) return null;
  const head = splitRow(lines[i]);
  return head.length === align.length ? { head, align } : null;
}

/** The first character of `line` after its spaces and tabs (undefined when blank). */
function lead(line) {
  let i = 0;
  while (line[i] === " " || line[i] === "\t") i++;
  return line[i];
}

// Only lines starting with one of these (after indentation) can open a block other than
// a paragraph or a table: the rest skip the block tests.
const MARKS = new Set("`~#>-*_+0123456789");

/** Whether `line` starts a block that ends a paragraph. */
function interrupts(line) {
  if (!MARKS.has(lead(line))) return false;
  if (fenceOpen(line) || heading(line) || isRule(line) || isQuote(line)) return true;
  const m = listMarker(line);
  return !!m && !m.empty && (!m.ordered || m.start === 1);
}

/**
 * The blocks of `lines` (one container's content). Each block is
 * `{type, ..., from, to}` with its source lines `[from, to)`.
 */
function parseBlocks(lines, depth, start = 0) {
  const blocks = [];
  const n = lines.length;
  let i = start;
  while (i < n) {
    const line = lines[i];
    const from = i;
    const c = lead(line);
    if (c === undefined) {
      i++;
      continue;
    }
    const marked = MARKS.has(c);
    const f = marked && fenceOpen(line);
    if (f) {
      const body = [];
      i++;
      while (i < n && !isFenceClose(lines[i], f)) body.push(dedent(lines[i++], f.indent));
      if (i < n) i++; // the closing fence
      blocks.push({ type: "code", info: f.info, text: body.join("\n"), from, to: i });
      continue;
    }
    const hd = marked && heading(line);
    if (hd) {
      blocks.push({ type: "heading", level: hd.level, text: hd.text, from, to: ++i });
      continue;
    }
    if (marked && isRule(line)) {
      blocks.push({ type: "rule", from, to: ++i });
      continue;
    }
    if (marked && depth < MAX_DEPTH && isQuote(line)) {
      const inner = [];
      while (i < n) {
        const l = lines[i];
        if (isQuote(l)) {
          const t = l.replace(/^ {0,3}> ?/, "");
          inner.push(t);
        } else if (!isBlank(l) && inner.length && !isBlank(inner[inner.length - 1]) && !interrupts(l)) {
          inner.push(l); // a lazy continuation of the quoted paragraph
        } else break;
        i++;
      }
      blocks.push({ type: "quote", children: parseBlocks(inner, depth + 1), from, to: i });
      continue;
    }
    const lm = marked && depth < MAX_DEPTH ? listMarker(line) : null;
    if (lm) {
      i = parseList(lines, i, lm, depth, blocks);
      continue;
    }
    const t = tableStart(lines, i);
    if (t) {
      const rows = [];
      i += 2;
      while (i < n && !isBlank(lines[i]) && lines[i].includes("|") && !interrupts(lines[i])) {
        rows.push(splitRow(lines[i++]));
      }
      blocks.push({ type: "table", head: t.head, align: t.align, rows, from, to: i });
      continue;
    }
    // A paragraph: up to a blank line or a block that interrupts it; a setext
    // underline makes it a heading.
    const para = [line.replace(/^[ \t]+/, "")];
    i++;
    let level = 0;
    while (i < n) {
      const l = lines[i];
      if (isBlank(l)) break;
      if (indentOf(l) < 4 && /^ {0,3}=+[ \t]*$/.test(l)) {
        level = 1;
        i++;
        break;
      }
      if (indentOf(l) < 4 && /^ {0,3}-+[ \t]*$/.test(l)) {
        level = 2;
        i++;
        break;
      }
      if (interrupts(l) || tableStart(lines, i)) break;
      para.push(l.replace(/^[ \t]+/, ""));
      i++;
    }
    const body = para.join("\n").trimEnd();
    blocks.push(level ? { type: "heading", level, text: body, from, to: i } : { type: "para", text: body, from, to: i });
  }
  return blocks;
}

/** Parses the list starting at `lines[i]` (marker `first`) into `blocks`; returns the next line. */
function parseList(lines, i, first, depth, blocks) {
  const n = lines.length;
  const from = i;
  const items = [];
  let loose = false;
  let blankBetween = false;
  while (i < n) {
    const m = listMarker(lines[i]);
    if (!m || m.ordered !== first.ordered || m.kind !== first.kind) break;
    if (blankBetween) loose = true;
    const item = [m.rest.replace(/^[ \t]+/, "")];
    i++;
    while (i < n) {
      const l = lines[i];
      if (isBlank(l)) item.push("");
      else if (indentOf(l) >= m.offset) item.push(dedent(l, m.offset));
      else if (!isBlank(item[item.length - 1]) && !interrupts(l) && !listMarker(l)) item.push(l.trim());
      else break;
      i++;
    }
    blankBetween = false;
    while (item.length > 1 && isBlank(item[item.length - 1])) {
      item.pop();
      blankBetween = true;
    }
    const children = parseBlocks(item, depth + 1);
    for (let k = 1; k < children.length; k++) {
      if (children[k].from > children[k - 1].to) loose = true;
    }
    items.push(children);
  }
  blocks.push({ type: "list", ordered: first.ordered, start: first.start, loose, items, from, to: i });
  return i;
}

function blockNode(b, tight) {
  switch (b.type) {
    case "para": {
      if (tight) {
        const frag = document.createDocumentFragment();
        inline(frag, b.text, 0, false);
        return frag;
      }
      const p = el("p");
      inline(p, b.text, 0, false);
      return p;
    }
    case "heading": {
      const hd = el("h" + b.level);
      inline(hd, b.text, 0, false);
      return hd;
    }
    case "rule":
      return el("hr");
    case "code": {
      const lang = (b.info.split(/[ \t]/)[0] || "").slice(0, 32);
      const code = el("code", null, b.text);
      const pre = el("pre", "md-code");
      if (lang) {
        // The language is a label only: nothing is loaded or run for it.
        pre.dataset.lang = inert(lang);
        pre.append(el("span", "md-lang", lang));
      }
      pre.append(code);
      return pre;
    }
    case "quote": {
      const q = el("blockquote");
      for (const c of b.children) q.append(blockNode(c, false));
      return q;
    }
    case "list": {
      const list = el(b.ordered ? "ol" : "ul");
      if (b.ordered && b.start !== 1) list.setAttribute("start", String(b.start));
      for (const children of b.items) {
        const li = el("li");
        for (const c of children) li.append(blockNode(c, !b.loose));
        list.append(li);
      }
      return list;
    }
    case "table": {
      const cols = Math.min(b.head.length, MAX_COLUMNS);
      const row = (cells, tag) => {
        const tr = el("tr");
        for (let k = 0; k < cols; k++) {
          const cell = el(tag, b.align[k] ? "align-" + b.align[k] : null);
          inline(cell, cells[k] ?? "", 0, false);
          tr.append(cell);
        }
        return tr;
      };
      const table = el("table", "md-table", el("thead", null, row(b.head, "th")));
      if (b.rows.length) {
        const body = el("tbody");
        for (const r of b.rows) body.append(row(r, "td"));
        table.append(body);
      }
      // Wide tables scroll in their own box.
      return el("div", "md-table-wrap", table);
    }
    default:
      return document.createTextNode("");
  }
}

function linesOf(src) {
  return String(src ?? "").split(/\r\n?|\n/);
}

/** `src` (Markdown) rendered as a `div.md`. */
export function markdown(src) {
  const root = el("div", "md");
  renderMarkdown(root, src);
  return root;
}

// element -> {src, lines, entries: [{key, from, to, nodes}]} of its last render
const RENDERED = new WeakMap();

/**
 * Renders `src` into `target` (its children replaced), reusing the nodes of the
 * top-level blocks whose source is the same as at the last render into `target`.
 * When `src` extends the last source (a reply streaming in), only the last two blocks
 * are parsed again: a block's extent depends on at most the line after it, and every
 * line but the last is unchanged.
 */
export function renderMarkdown(target, src) {
  src = String(src ?? "");
  const prev = RENDERED.get(target);
  const lines = linesOf(src);
  let reused = [];
  let start = 0;
  if (prev && src.startsWith(prev.src) && prev.entries.length > 2) {
    reused = prev.entries.slice(0, -2);
    start = prev.entries[prev.entries.length - 2].from;
  }
  const before = prev ? prev.entries : [];
  const entries = reused.slice();
  let same = reused.length;
  for (const b of parseBlocks(lines, 0, start)) {
    const key = b.type + "\n" + lines.slice(b.from, b.to).join("\n");
    const k = entries.length;
    let entry;
    if (same === k && before[k] && before[k].key === key) {
      entry = { ...before[k], from: b.from, to: b.to };
      same++;
    } else {
      entry = { key, from: b.from, to: b.to, nodes: [blockNode(b, false)] };
    }
    entries.push(entry);
  }
  RENDERED.set(target, { src, entries });
  // Keep the reused prefix in place; replace only what follows it.
  if (!prev) target.replaceChildren();
  else for (let k = same; k < before.length; k++) for (const n of before[k].nodes) n.remove();
  const frag = document.createDocumentFragment();
  for (let k = same; k < entries.length; k++) frag.append(...entries[k].nodes);
  target.append(frag);
  return target;
}
