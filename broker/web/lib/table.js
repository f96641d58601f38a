import { h, placeInOrder, setText } from "/lib/dom.js";

// ---------------------------------------------------------------------------------
// A table whose rows are keyed and updated in place: each column gives a value per
// record and paints its cell only when that value changed.

class KeyedTable {
  constructor({ id, caption, keyAttr, columns }) {
    this.keyAttr = keyAttr;
    this.columns = columns;
    this.rows = new Map();
    this.tbody = h("tbody");
    this.el = h("table", { id, class: "grid" },
      h("caption", { class: "sr-only" }, caption),
      h("thead", null, h("tr", null, columns.map((c) => h("th", { scope: "col", class: c.cls }, c.head)))),
      this.tbody);
  }

  has(key) {
    return this.rows.has(key);
  }

  upsert(key, rec) {
    let row = this.rows.get(key);
    if (!row) {
      const tr = h("tr");
      tr.dataset[this.keyAttr] = key;
      const cells = this.columns.map((c) =>
        tr.appendChild(c.rowHeader ? h("th", { scope: "row", class: c.cls }) : h("td", { class: c.cls })));
      row = { tr, cells, vals: [] };
      this.rows.set(key, row);
    }
    this.columns.forEach((c, i) => {
      const v = c.value(rec);
      if (row.vals[i] !== v) {
        row.vals[i] = v;
        if (c.paint) c.paint(row.cells[i], rec, v);
        else setText(row.cells[i], v);
      }
    });
  }

  remove(key) {
    const row = this.rows.get(key);
    if (row) {
      row.tr.remove();
      this.rows.delete(key);
    }
  }

  order(keys) {
    placeInOrder(this.tbody, keys.map((k) => this.rows.get(k).tr));
  }
}

export {
  KeyedTable,
};
