// The console's only script: live updates by polling an HTML fragment (keeping the jobs a
// person ticked), confirmations, and the submit form's choices. Every form works without it.
"use strict";

(function () {
  const live = document.getElementById("live");
  if (live && live.dataset.liveUrl) {
    const every = 2000;
    const refresh = async () => {
      if (live.dataset.final === "true") return;
      try {
        const response = await fetch(live.dataset.liveUrl, {
          credentials: "same-origin",
          headers: { "Accept": "text/html" },
        });
        if (response.redirected || response.status === 401) {
          window.location.reload();
          return;
        }
        if (response.ok) {
          const holder = document.createElement("div");
          holder.innerHTML = await response.text();
          const fresh = holder.querySelector("#live");
          if (fresh) {
            const kept = keepSelection(live);
            live.innerHTML = fresh.innerHTML;
            live.dataset.final = fresh.dataset.final || "false";
            kept();
          }
        }
      } catch (error) {
        // The platform may be restarting; try again on the next tick.
      }
      window.setTimeout(refresh, every);
    };
    window.setTimeout(refresh, every);
  }

  // The ticked boxes (and the focused one) of the region about to be replaced; the returned
  // function ticks them again in the new region, for the jobs that are still selectable.
  function keepSelection(region) {
    const boxes = () => region.querySelectorAll('input[type="checkbox"][name]');
    const key = (box) => box.name + "=" + box.value;
    const ticked = new Set();
    for (const box of boxes()) if (box.checked) ticked.add(key(box));
    const focused = region.contains(document.activeElement) ? document.activeElement : null;
    const focusKey = focused instanceof HTMLInputElement ? key(focused) : null;
    return () => {
      for (const box of boxes()) {
        if (ticked.has(key(box))) box.checked = true;
        if (key(box) === focusKey) box.focus();
      }
    };
  }

  // The submit form: choosing a server shows its kinds; choosing a kind puts its skeleton in
  // the payload editor unless something else was typed there.
  document.querySelectorAll("select[data-autosubmit]").forEach((select) => {
    select.addEventListener("change", () => select.form && select.form.submit());
  });
  const kinds = document.querySelector("select[data-kinds-schema]");
  const payload = document.getElementById("payload");
  if (kinds && payload) {
    let skeleton = kinds.selectedOptions[0] ? kinds.selectedOptions[0].dataset.skeleton : "";
    kinds.addEventListener("change", () => {
      const next = kinds.selectedOptions[0] ? kinds.selectedOptions[0].dataset.skeleton : "";
      if (payload.value.trim() === "" || payload.value === skeleton) payload.value = next || "{}";
      skeleton = next;
    });
  }

  // The schedule form: the next times of the calendar being typed, from the platform.
  const cron = document.querySelector("input[data-cron-preview]");
  const zone = document.getElementById("schedule-timezone");
  const preview = document.getElementById("cron-preview");
  if (cron && preview) {
    let pending = null;
    const show = async () => {
      const query = new URLSearchParams({ cron: cron.value, timezone: zone ? zone.value : "UTC" });
      try {
        const response = await fetch(cron.dataset.cronPreview + "?" + query.toString(), {
          credentials: "same-origin",
          headers: { "Accept": "text/html" },
        });
        if (!response.ok) return;
        const holder = document.createElement("div");
        holder.innerHTML = await response.text();
        const fresh = holder.querySelector("#cron-preview");
        if (fresh) preview.innerHTML = fresh.innerHTML;
      } catch (error) {
        // No preview while the platform does not answer; the form still works.
      }
    };
    const later = () => {
      window.clearTimeout(pending);
      pending = window.setTimeout(show, 300);
    };
    cron.addEventListener("input", later);
    if (zone) zone.addEventListener("input", later);
    show();
  }

  document.addEventListener("submit", (event) => {
    const form = event.target;
    if (form instanceof HTMLFormElement && form.dataset.confirm) {
      if (!window.confirm(form.dataset.confirm)) event.preventDefault();
    }
  });
})();
