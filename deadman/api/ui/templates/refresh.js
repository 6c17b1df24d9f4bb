// Auto-refresh: re-fetch this page and swap in its <main>, so scroll position and the
// page stay put (no full reload); off while the pointer is in a form.
(function () {
  var box = document.getElementById('auto');
  box.checked = localStorage.getItem('deadman-auto') !== 'off';
  box.addEventListener('change', function () {
    localStorage.setItem('deadman-auto', box.checked ? 'on' : 'off');
  });
  setInterval(function () {
    if (!box.checked || document.activeElement.closest('form')) return;
    fetch(location.href, {credentials: 'same-origin'}).then(function (r) {
      return r.ok ? r.text() : null;
    }).then(function (text) {
      if (!text) return;
      var doc = new DOMParser().parseFromString(text, 'text/html');
      var fresh = doc.querySelector('main');
      if (fresh) document.querySelector('main').replaceWith(fresh);
    }).catch(function () {});
  }, 2000);
})();
