// The history section of the stats and per-kind pages (templates/admin/django_venturi/job/history.html):
// while the page is open and visible, fetch the section's JSON view every few seconds and swap
// in its charts and figures. Without JavaScript the page is the same, refreshed by a reload.
(function () {
  var box = document.getElementById("venturi-history");
  if (!box || !window.fetch) { return; }
  function update(data) {
    Object.keys(data.charts).forEach(function (name) {
      var chart = box.querySelector('[data-chart="' + name + '"]');
      if (chart) { chart.innerHTML = data.charts[name]; }
    });
    var figures = Object.assign({}, data, data.seconds);
    box.querySelectorAll("[data-figure]").forEach(function (figure) {
      var value = figures[figure.getAttribute("data-figure")];
      if (value !== undefined && value !== null) { figure.textContent = value; }
    });
  }
  window.setInterval(function () {
    if (document.hidden) { return; }
    fetch(box.getAttribute("data-url"), {credentials: "same-origin", headers: {"Accept": "application/json"}})
      .then(function (response) { return response.ok ? response.json() : null; })
      .then(function (data) { if (data) { update(data); } })
      .catch(function () {});
  }, Number(box.getAttribute("data-every")));
})();
