// The panel's timeline: utilisation against time (left), step time against step (right, log scale), on one
// <canvas>. Finished runs come as synced state (`runs`, so a reloaded page draws them again); a running burst's
// points come as "points" messages holding only what is new. The page draws at most once per FRAME_MS, only
// while the chart is on screen and its tab visible (it tells the kernel, which then holds its messages back),
// and thins long series to the lowest and highest point of each pixel column. Hovering shows the nearest point.
//
//   state runs:  [{run, name, colour, ranks, steps: [[rank, warmup, step, ms], ...],
//                  util: [[device, t, pct, MiB], ...]}]
//   message:     {kind: "points", run, name, colour, ranks, steps: [...], util: [...]}   (appended)
//                  with ticker: {text, fraction} while a burst measures (its progress line, drawn on top)
//                {kind: "ticker", ticker: null}   (the action ended)
//                {kind: "forget", run}   (a live run replaced by the next one)
//   state hidden: runs unticked in the table; utilisation_title: the left axis's title; visible: set here.

const SETTLE_MS = 60;
const FRAME_MS = 500;  // the kernel sends once a second; a resize or a tick redraws within this
const HEIGHT = 300;  // with the actions above and the runs table under it, on one 1280x720 screen
const MARGIN = { l: 60, r: 10, t: 40, b: 45 };
const GAP = 0.08; // between the two subplots, as a share of the plotting width (plotly's horizontal_spacing)
const LEGEND_PX = 190; // beside the plots from NARROW_PX on
const LEGEND_ENTRY_PX = 140; // under the plots, narrower than NARROW_PX: each run's name (the table has it whole)
const LEGEND_ROW_PX = 18;
const LEGEND_GAP_PX = 8; // between the x axes' titles and the legend under them
const NARROW_PX = 820;
const DASHES = [[], [2, 3], [6, 4], [6, 3, 2, 3], [10, 4], [10, 3, 2, 3]];
const MIN_DECADES = 0.5;
const PAD_DECADES = 0.05;
const FONT_FAMILY = "'Open Sans', Verdana, Arial, sans-serif";
// The JupyterLab theme's colours, read from the page (so a dark theme draws light text on dark), with the light
// colours the chart has always had where no theme defines them (Notebook 7 without a theme, VS Code).
const THEME = {
  text: ["--jp-ui-font-color1", "#2a3f5f"], muted: ["--jp-ui-font-color2", "#555"],
  grid: ["--jp-border-color2", "#e5ecf6"], ticker: ["--jp-brand-color1", "#1565c0"],
  surface: ["--jp-layout-color1", "rgba(255,255,255,0.95)"], edge: ["--jp-border-color1", "#c8d4e3"],
  font: ["--jp-ui-font-family", FONT_FAMILY],
};
const TITLES = ["Device utilisation (hover: memory)", "Step time (hollow: warm-up / compile)"];
const SHORT_TITLES = ["Utilisation", "Step time (log)"];

function emptyRun(header) {
  return { name: header.name, colour: header.colour, ranks: header.ranks, steps: new Map(), util: new Map() };
}

function append(run, steps, util) {
  for (const [rank, warmup, step, ms] of steps) {
    const key = `${rank}:${warmup}`;
    if (!run.steps.has(key)) run.steps.set(key, { rank, warmup: !!warmup, x: [], y: [] });
    const series = run.steps.get(key);
    series.x.push(step);
    series.y.push(ms);
  }
  for (const [device, t, pct, mib] of util) {
    if (!run.util.has(device)) run.util.set(device, { index: run.util.size, x: [], y: [], mib: [] });
    const series = run.util.get(device);
    series.x.push(t);
    series.y.push(pct);
    series.mib.push(mib);
  }
}

// 1-2-5 ticks inside [low, high] (log10 units), finer the narrower the range: as the report's log_ticks.
function logTicks(low, high) {
  const span = high - low;
  const mantissas = span <= 1.5 ? [1, 1.5, 2, 3, 5, 7] : span <= 4 ? [1, 2, 5] : [1];
  const ticks = [];
  for (let e = Math.floor(low); e <= Math.ceil(high); e++) {
    for (const m of mantissas) {
      const v = m * 10 ** e;
      if (Math.log10(v) >= low && Math.log10(v) <= high) ticks.push(v);
    }
  }
  return ticks;
}

function linearTicks(low, high, count = 6) {
  const raw = (high - low) / count || 1;
  const magnitude = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * magnitude).find((s) => s >= raw) || raw;
  const ticks = [];
  for (let v = Math.ceil(low / step) * step; v <= high + 1e-9; v += step) ticks.push(+v.toPrecision(12));
  return ticks;
}

// At most two points (the lowest and the highest) per pixel column, in order: a minute-long burst of 1 ms steps
// draws as the same shape as its 60,000 points, at the cost of a few hundred.
function thinned(series, toX) {
  if (series.x.length <= 800) return series.x.map((x, i) => [toX(x), series.y[i]]);
  const out = [];
  let column = null, low = null, high = null;
  const flush = () => {
    if (column === null) return;
    out.push(low[0] <= high[0] ? low : high, low[0] <= high[0] ? high : low);
  };
  series.x.forEach((x, i) => {
    const px = Math.round(toX(x));
    const point = [px, series.y[i], i];
    if (px !== column) {
      flush();
      column = px;
      low = high = point;
    } else {
      if (point[1] < low[1]) low = point;
      if (point[1] > high[1]) high = point;
    }
  });
  flush();
  return out.map(([px, y]) => [px, y]);
}

function fmtMs(ms) {
  return ms >= 1e3 ? `${(ms / 1e3).toPrecision(3)} s` : `${ms.toPrecision(3)} ms`;
}

export default {
  render({ model, el }) {
    const canvas = document.createElement("canvas");
    canvas.className = "aw-live-canvas";
    canvas.setAttribute("role", "img");
    canvas.style.willChange = "transform";
    el.appendChild(canvas);
    let colours = null, FONT = "", TITLE_FONT = "";
    const readTheme = () => {
      const style = getComputedStyle(el);
      colours = Object.fromEntries(Object.entries(THEME).map(([key, [variable, fallback]]) =>
        [key, style.getPropertyValue(variable).trim() || fallback]));
      FONT = `12px ${colours.font}`;
      TITLE_FONT = `14px ${colours.font}`;
    };
    readTheme();
    const tooltip = document.createElement("div");
    tooltip.className = "aw-timeline-tooltip";
    const styleTooltip = () => {
      tooltip.style.cssText = `position: absolute; display: ${tooltip.style.display || "none"}; pointer-events: none; `
        + `background: ${colours.surface}; color: ${colours.text}; border: 1px solid ${colours.edge}; `
        + "border-radius: 3px; padding: 2px 6px; font: 12px sans-serif; white-space: nowrap;";
    };
    styleTooltip();
    el.style.position = "relative";
    // Its redraws stay inside its own box: the rest of the notebook is not laid out or painted again for them.
    el.style.contain = "layout paint";
    el.appendChild(tooltip);
    let finished = new Map();  // from the synced state
    const streaming = new Map();  // from messages, until the run is in the state
    let dirty = true, onScreen = false, timer = null, lastDraw = 0, width = el.clientWidth || 0;
    let boxes = null;  // where the last draw put each subplot, for hovering
    let titles = TITLES;
    let ticker = null;  // {text, fraction}: the measuring burst's progress
    const runs = () => {
      const all = new Map(finished);
      for (const [index, run] of streaming) if (!all.has(index)) all.set(index, run);
      return [...all.entries()].sort((a, b) => a[0] - b[0]);
    };
    const loadState = () => {
      finished = new Map();
      for (const run of model.get("runs")) {
        const entry = emptyRun(run);
        append(entry, run.steps, run.util);
        finished.set(run.run, entry);
        streaming.delete(run.run);
      }
    };
    loadState();

    // Drawn in the animation frame the page draws anyway for the kernel's other changes: the status line and the
    // progress bar arrive within SETTLE_MS of the points, so one frame a second, not two. Later when the last
    // draw was recent.
    const schedule = () => {
      dirty = true;
      if (timer !== null || !onScreen || document.hidden) return;
      const frame = () => {
        timer = requestAnimationFrame(() => {
          timer = null;
          if (dirty && onScreen && !document.hidden) draw();
        });
      };
      const wait = Math.max(SETTLE_MS, FRAME_MS - (performance.now() - lastDraw));
      timer = setTimeout(() => { timer = null; frame(); }, wait);
    };
    const reportVisibility = () => {
      const visible = onScreen && !document.hidden;
      if (model.get("visible") !== visible) {
        model.set("visible", visible);
        model.save_changes();
      }
      if (visible && dirty) schedule();
    };

    model.on("msg:custom", (msg) => {
      if ("ticker" in msg) ticker = msg.ticker || null;
      if (msg.kind === "points") {
        if (!streaming.has(msg.run)) streaming.set(msg.run, emptyRun(msg));
        append(streaming.get(msg.run), msg.steps, msg.util);
      } else if (msg.kind === "forget") {
        streaming.delete(msg.run);
        finished.delete(msg.run);
      }
      schedule();
    });
    model.on("change:runs", () => { loadState(); schedule(); });
    model.on("change:hidden", schedule);
    model.on("change:utilisation_title", schedule);

    function draw() {
      lastDraw = performance.now();
      dirty = false;
      width = el.clientWidth;
      if (!width) return;
      const narrow = width < NARROW_PX;
      titles = narrow ? SHORT_TITLES : TITLES;
      const shown = runs().filter(([index]) => !model.get("hidden").includes(index));
      // Narrow, the legend goes under the plots, as many names to a row as keep LEGEND_ENTRY_PX each.
      const legendColumns = Math.max(2, Math.floor((width - MARGIN.l - MARGIN.r) / LEGEND_ENTRY_PX));
      const legendRows = narrow ? Math.ceil(shown.length / legendColumns) : 0;
      const height = HEIGHT + (legendRows ? legendRows * LEGEND_ROW_PX + LEGEND_GAP_PX : 0);
      const ratio = window.devicePixelRatio || 1;
      if (canvas.width !== Math.round(width * ratio) || canvas.height !== Math.round(height * ratio)) {
        // Only when the size changes: setting a canvas's size reallocates and clears its whole backing store.
        canvas.width = Math.round(width * ratio);
        canvas.height = Math.round(height * ratio);
        canvas.style.width = `${width}px`;
        canvas.style.height = `${height}px`;
      }
      const ctx = canvas.getContext("2d");
      ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
      ctx.clearRect(0, 0, width, height);
      const right = width - MARGIN.r - (narrow ? 0 : LEGEND_PX);
      const plotting = right - MARGIN.l;
      const subplot = (plotting * (1 - GAP)) / 2;
      const top = MARGIN.t, bottom = HEIGHT - MARGIN.b;
      const util = { left: MARGIN.l, right: MARGIN.l + subplot, top, bottom };
      const step = { left: right - subplot, right, top, bottom };
      boxes = { util: drawUtilisation(ctx, util, shown), step: drawSteps(ctx, step, shown) };
      drawLegend(ctx, shown, narrow ? { x: MARGIN.l, y: HEIGHT + 4 + LEGEND_GAP_PX, columns: legendColumns, width: plotting }
        : { x: right + 18, y: top, columns: 1, width: LEGEND_PX - 18 });
      drawTicker(ctx, width);
      describe(shown);
    }

    // The measuring burst's progress: a thin bar along the top edge and its line in the corner.
    function drawTicker(ctx, width) {
      if (!ticker) return;
      ctx.fillStyle = colours.grid;
      ctx.fillRect(0, 0, width, 3);
      ctx.fillStyle = colours.ticker;
      ctx.fillRect(0, 0, width * ticker.fraction, 3);
      ctx.font = FONT;
      ctx.textAlign = "left";
      ctx.fillStyle = colours.muted;
      ctx.fillText(ticker.text, 4, 15);
    }

    // What the picture shows, in words (screen readers read it): the running burst's progress line, then per run
    // its steps and telemetry samples.
    function describe(shown) {
      const parts = shown.map(([index, run]) => {
        let steps = 0, samples = 0;
        for (const s of run.steps.values()) steps += s.x.length;
        for (const s of run.util.values()) samples += s.x.length;
        return `run ${index} ${run.name}: ${steps} steps, ${samples} utilisation samples`;
      });
      const progress = ticker ? ` ${ticker.text}.` : "";
      canvas.setAttribute("aria-label", `Timeline.${progress} ${parts.join("; ")}`);
    }

    function frame(ctx, box, title, xTitle, yTitle) {
      ctx.strokeStyle = colours.grid;
      ctx.lineWidth = 1;
      ctx.strokeRect(box.left, box.top, box.right - box.left, box.bottom - box.top);
      ctx.fillStyle = colours.text;
      ctx.font = TITLE_FONT;
      ctx.textAlign = "center";
      ctx.fillText(title, (box.left + box.right) / 2, box.top - 14);
      ctx.font = FONT;
      ctx.fillText(xTitle, (box.left + box.right) / 2, box.bottom + 36);
      ctx.save();
      ctx.translate(box.left - 44, (box.top + box.bottom) / 2);
      ctx.rotate(-Math.PI / 2);
      ctx.fillText(yTitle, 0, 0);
      ctx.restore();
    }

    function grid(ctx, box, xs, ys, toX, toY, label) {
      ctx.strokeStyle = colours.grid;
      ctx.fillStyle = colours.text;
      ctx.font = FONT;
      ctx.textAlign = "center";
      for (const x of xs) {
        const px = toX(x);
        ctx.beginPath(); ctx.moveTo(px, box.top); ctx.lineTo(px, box.bottom); ctx.stroke();
        ctx.fillText(`${x}`, px, box.bottom + 16);
      }
      ctx.textAlign = "right";
      for (const y of ys) {
        const py = toY(y);
        ctx.beginPath(); ctx.moveTo(box.left, py); ctx.lineTo(box.right, py); ctx.stroke();
        ctx.fillText(label(y), box.left - 6, py + 4);
      }
    }

    function line(ctx, points, toY, colour, dash, width) {
      if (!points.length) return;
      ctx.strokeStyle = colour;
      ctx.lineWidth = width;
      ctx.setLineDash(dash);
      ctx.beginPath();
      points.forEach(([px, y], i) => (i ? ctx.lineTo(px, toY(y)) : ctx.moveTo(px, toY(y))));
      ctx.stroke();
      ctx.setLineDash([]);
    }

    function drawUtilisation(ctx, box, shown) {
      let end = 1;
      for (const [, run] of shown) for (const s of run.util.values()) end = Math.max(end, s.x[s.x.length - 1] || 0);
      const toX = (t) => box.left + ((box.right - box.left) * t) / end;
      const toY = (pct) => box.bottom - ((box.bottom - box.top) * pct) / 105;
      frame(ctx, box, titles[0], "time since launch (s)", model.get("utilisation_title"));
      grid(ctx, box, linearTicks(0, end), [0, 20, 40, 60, 80, 100], toX, toY, (v) => `${v}`);
      ctx.save();
      ctx.beginPath(); ctx.rect(box.left, box.top, box.right - box.left, box.bottom - box.top); ctx.clip();
      for (const [, run] of shown) {
        for (const s of run.util.values()) {
          const points = thinned(s, toX).filter(([, y]) => y !== null);
          line(ctx, points, toY, run.colour, DASHES[s.index % DASHES.length], 2);
        }
      }
      ctx.restore();
      return { ...box, toX, toY, shown, kind: "util" };
    }

    function drawSteps(ctx, box, shown) {
      let last = 1;
      const measured = [], warm = [];
      for (const [, run] of shown) {
        for (const s of run.steps.values()) {
          last = Math.max(last, s.x[s.x.length - 1] || 0);
          for (const y of s.y) if (y > 0) (s.warmup ? warm : measured).push(y);
        }
      }
      const values = measured.length ? measured : warm;
      let low = values.length ? Math.log10(Math.min(...values)) : 0;
      let high = values.length ? Math.log10(Math.max(...values)) : 1;
      const widen = Math.max(0, MIN_DECADES - (high - low)) / 2;
      low -= widen + PAD_DECADES;
      high += widen + PAD_DECADES;
      const toX = (x) => box.left + ((box.right - box.left) * x) / last;
      const toY = (ms) => box.bottom - ((box.bottom - box.top) * (Math.log10(ms) - low)) / (high - low);
      const above = measured.length ? warm.filter((ms) => Math.log10(ms) > high) : [];
      let note = above.length ? ` (▲ ${above.length} warm-up/compile step${above.length > 1 ? "s" : ""} above the `
        + `plot, slowest ${fmtMs(Math.max(...above))})` : "";
      ctx.font = FONT;
      if (note && ctx.measureText(`step${note}`).width > box.right - box.left) note = ` (▲ ${above.length} above)`;
      frame(ctx, box, titles[1], `step${note}`, "step time (ms, log)");
      grid(ctx, box, linearTicks(0, last), logTicks(low, high), toX, toY, (v) => `${+v.toPrecision(3)}`);
      ctx.save();
      ctx.beginPath(); ctx.rect(box.left, box.top, box.right - box.left, box.bottom - box.top); ctx.clip();
      for (const [, run] of shown) {
        for (const s of run.steps.values()) {
          const points = thinned(s, toX);
          if (s.warmup) {
            ctx.strokeStyle = run.colour;
            ctx.globalAlpha = 0.7;
            ctx.lineWidth = 2;
            for (const [px, y] of points) {
              ctx.beginPath(); ctx.arc(px, toY(y), 4.5, 0, 2 * Math.PI); ctx.stroke();
            }
            ctx.globalAlpha = 1;
          } else {
            line(ctx, points, toY, run.colour, DASHES[s.rank % DASHES.length], 2);
            ctx.fillStyle = run.colour;
            if (points.length <= 200) for (const [px, y] of points) ctx.fillRect(px - 2, toY(y) - 2, 4, 4);
          }
        }
      }
      ctx.restore();
      return { ...box, toX, toY, shown, kind: "step" };
    }

    // The point nearest the mouse in the subplot under it, within 12 px: what plotly's hover would say.
    function nearest(x, y) {
      const box = boxes && [boxes.util, boxes.step].find((b) => x >= b.left && x <= b.right && y >= b.top
        && y <= b.bottom);
      if (!box) return null;
      let best = null;
      for (const [index, run] of box.shown) {
        const all = box.kind === "util" ? run.util : run.steps;
        for (const [key, s] of all) {
          s.x.forEach((sx, i) => {
            if (s.y[i] === null || !(box.kind === "util" || s.y[i] > 0)) return;
            const d = Math.hypot(box.toX(sx) - x, box.toY(s.y[i]) - y);
            if (d < 12 && (!best || d < best.d)) best = { d, index, run, key, s, i };
          });
        }
      }
      if (!best) return null;
      const { run, key, s, i } = best;
      if (box.kind === "util") {
        return `${run.name} ${key}: ${Math.round(s.y[i])}% busy, ${s.mib[i].toLocaleString()} MiB at ${s.x[i].toFixed(1)} s`;
      }
      const rank = run.ranks > 1 ? ` rank ${s.rank}` : "";
      return `${run.name}${rank} ${s.warmup ? "warm-up step" : "step"} ${s.x[i]}: ${fmtMs(s.y[i])}`;
    }

    let hoverFrame = null;
    canvas.addEventListener("mousemove", (event) => {
      if (hoverFrame !== null) return;
      hoverFrame = requestAnimationFrame(() => {
        hoverFrame = null;
        const rect = canvas.getBoundingClientRect();
        const x = event.clientX - rect.left, y = event.clientY - rect.top;
        const text = nearest(x, y);
        tooltip.style.display = text ? "block" : "none";
        if (text) {
          tooltip.textContent = text;
          tooltip.style.left = `${Math.min(x + 12, width - tooltip.offsetWidth - 4)}px`;
          tooltip.style.top = `${y - 28}px`;
        }
      });
    });
    canvas.addEventListener("mouseleave", () => { tooltip.style.display = "none"; });

    function drawLegend(ctx, shown, where) {
      ctx.font = FONT;
      ctx.textAlign = "left";
      const column = where.width / where.columns;
      shown.forEach(([, run], i) => {
        const x = where.x + (i % where.columns) * column;
        const y = where.columns === 1 ? where.y + 10 + i * 20 : where.y + Math.floor(i / where.columns) * LEGEND_ROW_PX;
        ctx.fillStyle = run.colour;
        ctx.fillRect(x, y - 8, 14, 4);
        ctx.fillStyle = colours.text;
        const room = column - 22;
        let text = run.name;
        while (text.length > 4 && ctx.measureText(text).width > room) text = `${text.slice(0, -2)}…`;
        ctx.fillText(text, x + 20, y - 2);
      });
    }

    const intersection = new IntersectionObserver(([entry]) => {
      onScreen = entry.isIntersecting;
      reportVisibility();
    });
    intersection.observe(el);
    const resize = new ResizeObserver(() => {
      if (el.clientWidth !== width) schedule();
    });
    resize.observe(el);
    document.addEventListener("visibilitychange", reportVisibility);
    // JupyterLab swaps its theme by changing the body's theme attributes: the chart takes the new colours.
    const theme = new MutationObserver(() => { readTheme(); styleTooltip(); schedule(); });
    theme.observe(document.body, { attributes: true, attributeFilter: ["data-jp-theme-name", "data-jp-theme-light"] });
    return () => {
      theme.disconnect();
      clearTimeout(timer);
      cancelAnimationFrame(timer);
      intersection.disconnect();
      resize.disconnect();
      document.removeEventListener("visibilitychange", reportVisibility);
    };
  },
};
