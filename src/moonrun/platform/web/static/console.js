// The console's only script: live updates by polling an HTML fragment, confirmations, and the
// submit form's choices.
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
            live.innerHTML = fresh.innerHTML;
            live.dataset.final = fresh.dataset.final || "false";
          }
        }
      } catch (error) {
        // The platform may be restarting; try again on the next tick.
      }
      window.setTimeout(refresh, every);
    };
    window.setTimeout(refresh, every);
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

  document.addEventListener("submit", (event) => {
    const form = event.target;
    if (form instanceof HTMLFormElement && form.dataset.confirm) {
      if (!window.confirm(form.dataset.confirm)) event.preventDefault();
    }
  });
})();
