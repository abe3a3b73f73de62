// Markdown to HTML for the model's answers: paragraphs, headings, lists, quotes, tables,
// fenced code (with a copy button), inline code, emphasis, links. Every piece of text is
// escaped before any tag is made, and only http(s) and mailto links are kept, so what a
// model writes can never become markup of its own. A fence left open (an answer still
// streaming) renders as code up to the end.

const ENTITIES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

export function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => ENTITIES[c]);
}

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^\s`]*)/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$/;
const RULE = /^ {0,3}([-*_])(?:\s*\1){2,}\s*$/;
const QUOTE = /^ {0,3}> ?/;
const ITEM = /^( *)([-*+]|\d{1,9}[.)])(\s+)(.*)$/;
const TABLE_RULE = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;

function indentOf(line) {
  return line.length - line.trimStart().length;
}

function startsBlock(line) {
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) || ITEM.test(line);
}

function safeUrl(url) {
  return /^(https?:\/\/|mailto:)/i.test(url) ? url : null;
}

function link(href, label) {
  return `<a href="${href}" target="_blank" rel="noopener noreferrer">${label}</a>`;
}

// Inline markup of one block's text. Code spans and links are set aside first, each
// escaped on its own (as \u0000N\u0000 marks), so that nothing inside them is read as emphasis.
export function renderInline(text) {
  const kept = [];
  const keep = (html) => `\u0000${kept.push(html) - 1}\u0000`;
  let s = String(text).replace(/\u0000/g, "");
  s = s.replace(/(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)/g, (_, __, code) => keep(`<code>${escapeHtml(code)}</code>`));
  s = s.replace(/\[([^\]\n]+)\]\(([^()\s]+)\)/g, (whole, label, url) => {
    const href = safeUrl(url);
    return href ? keep(link(escapeHtml(href), escapeHtml(label))) : whole;
  });
  s = s.replace(/\bhttps?:\/\/[^\s<>"'\u0000]*[^\s<>"'\u0000.,;:!?)\]*_]/g,
    (url) => keep(link(escapeHtml(url), escapeHtml(url))));
  s = escapeHtml(s);
  s = s.replace(/\*\*(?=\S)([\s\S]*?\S)\*\*/g, "<strong>$1</strong>");
  s = s.replace(/(^|[^\w])__(?=\S)([\s\S]*?\S)__(?!\w)/g, "$1<strong>$2</strong>");
  s = s.replace(/(^|[^*\w])\*(?=[^\s*])([^*]*?[^\s*])\*(?![*\w])/g, "$1<em>$2</em>");
  s = s.replace(/(^|[^\w])_(?=[^\s_])([^_]*?[^\s_])_(?!\w)/g, "$1<em>$2</em>");
  s = s.replace(/~~(?=\S)([\s\S]*?\S)~~/g, "<del>$1</del>");
  s = s.replace(/\n/g, "<br>");
  while (/\u0000\d+\u0000/.test(s)) {
    s = s.replace(/\u0000(\d+)\u0000/g, (_, i) => kept[Number(i)]);
  }
  return s;
}

export function codeBlock(code, lang) {
  const name = lang ? escapeHtml(lang) : "";
  return `<div class="code-block"><div class="code-head"><span>${name || "code"}</span>` +
    `<button type="button" class="copy" data-copy>Copy</button></div>` +
    `<pre><code${name ? ` class="language-${name}"` : ""}>${escapeHtml(code)}</code></pre></div>`;
}

function cells(row) {
  let r = row.trim();
  if (r.startsWith("|")) r = r.slice(1);
  if (r.endsWith("|") && !r.endsWith("\\|")) r = r.slice(0, -1);
  return r.split(/(?<!\\)\|/).map((c) => c.trim().replace(/\\\|/g, "|"));
}

function table(lines, i, out) {
  const head = cells(lines[i]);
  const aligns = cells(lines[i + 1]).map((c) =>
    c.startsWith(":") && c.endsWith(":") ? "center" : c.endsWith(":") ? "right" : c.startsWith(":") ? "left" : "");
  const cell = (tag, text, k) =>
    `<${tag}${aligns[k] ? ` class="align-${aligns[k]}"` : ""}>${renderInline(text)}</${tag}>`;
  let html = `<div class="table-wrap"><table><thead><tr>${head.map((c, k) => cell("th", c, k)).join("")}</tr>` +
    "</thead><tbody>";
  i += 2;
  while (i < lines.length && lines[i].includes("|") && lines[i].trim()) {
    const row = cells(lines[i]);
    html += `<tr>${head.map((_, k) => cell("td", row[k] ?? "", k)).join("")}</tr>`;
    i++;
  }
  out.push(html + "</tbody></table></div>");
  return i;
}

function list(lines, i, out) {
  const first = lines[i].match(ITEM);
  const base = first[1].length;
  const ordered = /\d/.test(first[2]);
  const items = [];
  let loose = false;
  while (i < lines.length) {
    const m = lines[i].match(ITEM);
    if (!m || m[1].length !== base || /\d/.test(m[2]) !== ordered) break;
    const offset = m[1].length + m[2].length + Math.min(m[3].length, 4);
    const body = [m[4]];
    i++;
    while (i < lines.length) {
      const line = lines[i];
      if (!line.trim()) {
        const next = lines.slice(i + 1).find((l) => l.trim());
        if (next === undefined || indentOf(next) <= base) break;
        loose = loose || !ITEM.test(next) || indentOf(next) > base;
        body.push("");
        i++;
      } else if (indentOf(line) > base) {
        body.push(line.slice(Math.min(indentOf(line), offset)));
        i++;
      } else if (startsBlock(line)) {
        break;
      } else {
        body.push(line); // a lazy continuation of the item's paragraph
        i++;
      }
    }
    items.push(body);
  }
  const tag = ordered ? "ol" : "ul";
  const start = ordered && parseInt(first[2], 10) !== 1 ? ` start="${parseInt(first[2], 10)}"` : "";
  const inner = items.map((body) => {
    let html = blocks(body);
    if (!loose) html = html.replace(/^<p>([\s\S]*?)<\/p>/, "$1");
    return `<li>${html}</li>`;
  });
  out.push(`<${tag}${start}>${inner.join("")}</${tag}>`);
  return i;
}

function blocks(lines) {
  const out = [];
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if ((m = line.match(FENCE))) {
      const fence = m[1];
      const body = [];
      i++;
      while (i < lines.length && !(lines[i].trim().startsWith(fence) && lines[i].trim().replace(/[`~]/g, "") === "")) {
        body.push(lines[i]);
        i++;
      }
      i++;
      out.push(codeBlock(body.join("\n"), m[2]));
    } else if (!line.trim()) {
      i++;
    } else if ((m = line.match(HEADING))) {
      const n = m[1].length;
      out.push(`<h${n}>${renderInline(m[2])}</h${n}>`);
      i++;
    } else if (RULE.test(line)) {
      out.push("<hr>");
      i++;
    } else if (QUOTE.test(line)) {
      const inner = [];
      while (i < lines.length && lines[i].trim() && (QUOTE.test(lines[i]) || !startsBlock(lines[i]))) {
        inner.push(lines[i].replace(QUOTE, ""));
        i++;
      }
      out.push(`<blockquote>${blocks(inner)}</blockquote>`);
    } else if (line.includes("|") && i + 1 < lines.length && TABLE_RULE.test(lines[i + 1]) &&
               lines[i + 1].includes("-")) {
      i = table(lines, i, out);
    } else if (ITEM.test(line)) {
      i = list(lines, i, out);
    } else {
      const para = [];
      while (i < lines.length && lines[i].trim() && (para.length === 0 || !startsBlock(lines[i]))) {
        para.push(lines[i].trim());
        i++;
      }
      out.push(`<p>${renderInline(para.join("\n"))}</p>`);
    }
  }
  return out.join("");
}

export function renderMarkdown(text) {
  return blocks(String(text).replace(/\r\n?/g, "\n").split("\n"));
}
