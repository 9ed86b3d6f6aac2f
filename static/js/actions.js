// Behaviour templates ask for with data attributes, because the Content-Security-Policy allows
// no inline handlers: data-confirm="question" on a form asks before it is submitted;
// data-copy="element-id" on a button copies that element's text.
document.addEventListener(
  "submit",
  (event) => {
    const question = event.target.dataset && event.target.dataset.confirm;
    if (question && !window.confirm(question)) {
      event.preventDefault();
      event.stopPropagation(); // htmx must not send it either
    }
  },
  true,
);

document.addEventListener("click", (event) => {
  const button = event.target.closest("[data-copy]");
  if (button) navigator.clipboard.writeText(document.getElementById(button.dataset.copy).textContent);
});
