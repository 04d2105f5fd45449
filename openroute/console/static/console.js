// The console's only script (a file: the content policy allows no inline script).
// "select all" of the message list checks or clears every message's box.
document.addEventListener("DOMContentLoaded", () => {
  const all = document.getElementById("select-all");
  if (all) {
    all.addEventListener("click", () => {
      for (const box of document.querySelectorAll("input[name=id]")) box.checked = all.checked;
    });
  }
});
