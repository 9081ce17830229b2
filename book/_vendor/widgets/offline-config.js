/* Loaded on pages with widget snapshots, between require.js and embed-amd.js (see _config.yml,
 * nb_ipywidgets_js). Two fixes that let the vendored @jupyter-widgets/html-manager 1.0.6 work offline:
 *
 * 1. require.js resolves the html-manager's module relative to the *page*, and the bundle derives the
 *    URL of its fonts from that module's URL, so fonts were fetched from <page dir>/@jupyter-widgets/...
 *    (404). Map the module path onto this folder (_static/widgets/).
 * 2. ipywidgets typesets widget labels with the MathJax 2 API (MathJax.Hub.Queue); the site uses
 *    MathJax 3. Give MathJax 3 a minimal Hub.Queue that typesets the element with typesetPromise.
 */
(function () {
  "use strict";
  var here = document.currentScript.src.replace(/[?#].*$/, "").replace(/\/[^/]*$/, "");
  require.config({ paths: { "@jupyter-widgets/html-manager/dist": here } });

  var hub = {
    Queue: function () {
      Array.prototype.forEach.call(arguments, function (job) {
        if (!Array.isArray(job) || job[0] !== "Typeset") { return; }
        var el = job[2], mj = window.MathJax;
        if (!el || !mj || !mj.startup || !mj.startup.promise) { return; }
        mj.startup.promise.then(function () { return mj.typesetPromise([el]); })
          .catch(function (err) { console.warn("MathJax could not typeset a widget label:", err); });
      });
    },
  };
  var mj = window.MathJax;
  if (!mj) { return; }                // no math on this page: ipywidgets will not typeset
  if (mj.version) { mj.Hub = mj.Hub || hub; return; }   // MathJax 3 already loaded
  mj.startup = mj.startup || {};      // still the configuration object: hook MathJax 3's startup
  var ready = mj.startup.ready;
  mj.startup.ready = function () {
    if (ready) { ready(); } else { window.MathJax.startup.defaultReady(); }
    window.MathJax.Hub = window.MathJax.Hub || hub;
  };
})();
