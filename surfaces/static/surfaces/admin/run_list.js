// Run list: the "Filters" disclosure (templates/admin/diagnosis/diagnosisrun/change_list.html) stays as the
// reader left it for this tab (sessionStorage), so picking a filter, which reloads the page, does not fold
// the filters away under the reader's hand. Closed by default: the first run row is on the first screen.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  const filters = document.getElementById("dc-run-filters");
  if (!filters) return;
  const KEY = "dc-run-filters-open";
  try {
    if (window.sessionStorage.getItem(KEY) === "1") filters.open = true;
  } catch (e) { /* storage refused: the default (closed) holds */ }
  filters.addEventListener("toggle", () => {
    try {
      window.sessionStorage.setItem(KEY, filters.open ? "1" : "0");
    } catch (e) { /* storage refused: nothing to remember */ }
  });
});
