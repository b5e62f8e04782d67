// Warrant console: progressive enhancement only; every action works without this script.
"use strict";

// Expiry countdowns: <time data-expires="RFC 3339"> shows the time left.
function tick() {
  const now = Date.now();
  for (const el of document.querySelectorAll("time[data-expires]")) {
    const left = Math.floor((Date.parse(el.dataset.expires) - now) / 1000);
    if (Number.isNaN(left)) continue;
    if (left <= 0) { el.textContent = "expired"; continue; }
    const h = Math.floor(left / 3600), m = Math.floor((left % 3600) / 60), s = left % 60;
    el.textContent = (h ? h + "h " : "") + (h || m ? m + "m " : "") + s + "s left";
  }
}

// The inbox refreshes itself when the number of pending approvals changes (and no form field
// is being edited); otherwise it says so.
function watchInbox() {
  const inbox = document.querySelector("[data-pending-count]");
  if (!inbox) return;
  let known = inbox.dataset.pendingCount;
  setInterval(async () => {
    try {
      const r = await fetch("/console/approvals/count", { credentials: "same-origin", cache: "no-store" });
      if (!r.ok) return;
      const { pending } = await r.json();
      if (String(pending) === known) return;
      known = String(pending);
      const editing = document.activeElement && ["INPUT", "TEXTAREA", "SELECT"].includes(document.activeElement.tagName);
      if (editing) {
        const note = document.querySelector(".fresh");
        if (note) note.classList.add("shown");
      } else {
        location.reload();
      }
    } catch (_) { /* offline: try again later */ }
  }, 5000);
}

document.addEventListener("DOMContentLoaded", () => {
  tick();
  setInterval(tick, 1000);
  watchInbox();
});
