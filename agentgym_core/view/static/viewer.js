// agentgym view: keyboard shortcuts and live reloading (every page works without this).
// Left / right arrow: previous / next turn.
document.addEventListener("keydown", function (event) {
  if (event.target.closest("input, select, textarea")) return;
  var link = null;
  if (event.key === "ArrowLeft") link = document.getElementById("prev");
  if (event.key === "ArrowRight") link = document.getElementById("next");
  if (link) window.location.href = link.href;
});

// Live pages (overview, episodes): poll /api/version every 2 s while the "live" box is
// ticked and the tab is visible; reload when the run has logged something new.
(function () {
  var version = document.body.dataset.liveVersion;
  var box = document.getElementById("live");
  if (!version || !box) return;
  if (window.localStorage.getItem("agentgym-view-live") === "off") box.checked = false;
  box.addEventListener("change", function () {
    window.localStorage.setItem("agentgym-view-live", box.checked ? "on" : "off");
  });
  window.setInterval(function () {
    if (!box.checked || document.hidden) return;
    if (document.activeElement && document.activeElement.closest("input, select, textarea")) return;
    fetch("/api/version")
      .then(function (response) { return response.json(); })
      .then(function (data) { if (data.version !== version) window.location.reload(); })
      .catch(function () {});
  }, 2000);
})();
