// The panel's runs table, fitted to the width it is given. Every column shows while the table fits on one line a row;
// when it does not, the least important columns fold (highest `fold` first, columns without a number in any row
// before the rest; 0 never folds) into each row's details, which a click on the row opens and its hover shows, so no
// column is cut or scrolled out of sight. Where even that is too wide, the run's name and its status wrap instead of
// being cut. Past `max_rows` rows the table scrolls inside its own box under a header that stays, and a new run
// scrolls it to the newest row. Colours are the JupyterLab theme's (runs_table.css).
//
//   state columns: [{key, header, meaning, align: "left" | "right", fold}]
//   state rows:    [{run, label: "#3", colour, cells: [{html, title}, ...] (one per column)}]
//   state hidden:  runs unticked (set here when a tick changes); max_rows; empty: what an empty table says

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

export default {
  render({ model, el }) {
    el.classList.add("aw-runs-table");
    const box = element("div", "aw-runs-box");
    const table = element("table");
    const empty = element("div", "aw-runs-empty");
    const note = element("div", "aw-runs-folded");
    box.appendChild(table);
    el.append(box, note, empty);
    let folded = new Set();  // column keys folded into the rows' details
    const open = new Set();  // runs whose details are open
    let width = 0, rowsShown = 0;

    const columns = () => model.get("columns");
    const foldedText = (row) => columns().map((column, i) => [column, row.cells[i]])
      .filter(([column]) => folded.has(column.key))
      .map(([column, cell]) => {
        const scratch = element("span");
        scratch.innerHTML = cell.html;
        return `${column.header} ${scratch.textContent.trim()}`;
      }).join(" · ");

    function build() {
      const hidden = new Set(model.get("hidden"));
      const rows = model.get("rows");
      const head = element("thead");
      const headRow = element("tr");
      const first = element("th", "aw-col-run", "run");
      first.title = "tick to show the run in the live chart; click a row for its folded columns";
      headRow.appendChild(first);
      for (const column of columns()) {
        const th = element("th", `aw-col-${column.key} aw-${column.align}`, column.header);
        th.title = column.meaning;
        if (folded.has(column.key)) th.hidden = true;
        headRow.appendChild(th);
      }
      head.appendChild(headRow);
      const body = element("tbody");
      for (const row of rows) {
        const tr = element("tr", "aw-run");
        tr.dataset.run = row.run;
        const cell = element("td", "aw-col-run");
        const swatch = element("span", "aw-swatch");
        swatch.style.background = row.colour;
        const label = element("label");
        const tick = element("input");
        tick.type = "checkbox";
        tick.checked = !hidden.has(row.run);
        tick.title = "show this run in the live chart";
        tick.addEventListener("click", (event) => event.stopPropagation());
        tick.addEventListener("change", () => {
          const now = new Set(model.get("hidden"));
          if (tick.checked) now.delete(row.run); else now.add(row.run);
          model.set("hidden", [...now].sort((a, b) => a - b));
          model.save_changes();
        });
        label.append(tick, document.createTextNode(row.label));
        label.addEventListener("click", (event) => event.stopPropagation());
        const more = element("span", "aw-more", folded.size ? (open.has(row.run) ? "▾" : "▸") : "");
        cell.append(swatch, label, more);
        tr.appendChild(cell);
        columns().forEach((column, i) => {
          const td = element("td", `aw-col-${column.key} aw-${column.align}`);
          td.innerHTML = row.cells[i].html;
          if (row.cells[i].title) td.title = row.cells[i].title;
          if (folded.has(column.key)) td.hidden = true;
          tr.appendChild(td);
        });
        const details = folded.size ? foldedText(row) : "";
        if (details) tr.title = `${row.label}: ${details} (click for details)`;
        tr.addEventListener("click", () => {
          if (!folded.size) return;
          if (open.has(row.run)) open.delete(row.run); else open.add(row.run);
          build();
        });
        body.appendChild(tr);
        if (details && open.has(row.run)) {
          const extra = element("tr", "aw-details");
          const td = element("td");
          td.colSpan = 1 + columns().length;
          td.textContent = details;
          extra.appendChild(td);
          body.appendChild(extra);
        }
      }
      table.replaceChildren(head, body);
      empty.textContent = rows.length ? "" : model.get("empty");
      empty.hidden = rows.length > 0;
      note.hidden = !(folded.size && rows.length);
      note.textContent = folded.size ? `${columns().filter((c) => folded.has(c.key)).map((c) => c.header)
        .join(", ")}: folded to fit, click a row (or hover it) for them` : "";
      bound(rows.length);
    }

    // Past max_rows rows the box scrolls under its sticky header; a new run brings the newest row into view.
    function bound(count) {
      const limit = model.get("max_rows");
      const rows = [...table.querySelectorAll("tr.aw-run")];
      if (rows.length > limit) {
        const header = table.tHead ? table.tHead.offsetHeight : 0;
        const tail = rows.slice(-limit).reduce((sum, tr) => sum + tr.offsetHeight, 0);
        box.style.maxHeight = `${header + tail + 2}px`;
      } else {
        box.style.maxHeight = "";
      }
      if (count > rowsShown) box.scrollTop = box.scrollHeight;
      rowsShown = count;
    }

    // Fold the least important columns until the table fits its box on one line a row: all shown first, then one
    // at a time, the columns no run has a number in (all "–") before the rest. Only when every foldable column is
    // folded and it still does not fit do the run's name and its status wrap.
    function fit() {
      width = el.clientWidth;
      if (!width) return;
      folded = new Set();
      el.classList.remove("aw-wrap");
      build();
      const rows = model.get("rows");
      const blank = (i) => rows.length > 0 && rows.every((row) => {
        const scratch = element("span");
        scratch.innerHTML = row.cells[i].html;
        return scratch.textContent.trim() === "–";
      });
      const order = columns().map((c, i) => [c, blank(i)]).filter(([c]) => c.fold > 0)
        .sort(([a, aBlank], [b, bBlank]) => (bBlank - aBlank) || (b.fold - a.fold)).map(([c]) => c);
      const fits = () => box.scrollWidth <= box.clientWidth + 0.5;
      for (const column of order) {
        if (fits()) return;
        folded.add(column.key);
        build();
      }
      if (!fits()) {
        el.classList.add("aw-wrap");
        build();
      }
    }

    model.on("change:rows", fit);
    model.on("change:columns", fit);
    model.on("change:hidden", build);
    model.on("change:max_rows", build);
    const resize = new ResizeObserver(() => { if (el.clientWidth !== width) fit(); });
    resize.observe(el);
    fit();
    return () => resize.disconnect();
  },
};
