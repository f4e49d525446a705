// Keeps Baton's dashboard live. The server renders the page; every refresh it sends the
// page's live part again as a `view` server-sent event, which replaces <main id="view">.
// The browser reconnects a dropped stream by itself; a refused one (too many live pages,
// member stopping) is retried after a pause. No framework, no build step: this file is
// served from the binary as written.
(function () {
  'use strict';
  var view = document.getElementById('view');
  var live = document.getElementById('live');
  var updates = 0;

  function show(state, text) {
    live.dataset.state = state;
    live.textContent = text;
  }

  function connect() {
    var stream = new EventSource('/ui/events');
    stream.addEventListener('open', function () {
      show('live', 'live');
    });
    stream.addEventListener('view', function (event) {
      // Rendered and escaped by the server (maud); it carries no scripts.
      view.innerHTML = event.data;
      updates += 1;
      document.body.dataset.updates = String(updates);
      show('live', 'live');
    });
    stream.addEventListener('expired', function () {
      stream.close();
      window.location.assign('/ui/login?expired');
    });
    stream.onerror = function () {
      if (stream.readyState === EventSource.CLOSED) {
        show('down', 'offline, retrying');
        setTimeout(connect, 5000);
      } else {
        show('reconnecting', 'reconnecting…');
      }
    };
  }

  connect();
})();
