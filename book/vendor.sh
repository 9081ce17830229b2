#!/usr/bin/env bash
# Fetch the three JavaScript packages the built site needs, from the npm registry, into book/_vendor/
# so that the site works with no internet. The result is committed; rerun this only to upgrade.
#   require.js 2.3.7, @jupyter-widgets/html-manager 1.0.6 (the versions myst-nb expects), MathJax 3.2.2
# Not under _static/: Jupyter Book 1 adds every .js found there to every page (they would load twice).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
npm pack --silent requirejs@2.3.7 @jupyter-widgets/html-manager@1.0.6 mathjax@3.2.2 >/dev/null
for f in *.tgz; do mkdir -p "${f%.tgz}"; tar xzf "$f" -C "${f%.tgz}"; done
out="$here/_vendor"
# Keep our own files (widgets/offline-config.js: see its header), replace everything that came from npm.
rm -rf "$out/mathjax"; mkdir -p "$out/widgets" "$out/mathjax"
find "$out/widgets" -mindepth 1 ! -name offline-config.js -exec rm -rf {} +
cp requirejs-2.3.7/package/require.js "$out/widgets/"
cp requirejs-2.3.7/package/LICENSE "$out/widgets/LICENSE.requirejs" 2>/dev/null || true
find jupyter-widgets-html-manager-1.0.6/package/dist -maxdepth 1 -type f ! -name '*.map' ! -name embed.js -exec cp {} "$out/widgets/" \;
cp jupyter-widgets-html-manager-1.0.6/package/LICENSE "$out/widgets/LICENSE.html-manager"
m=mathjax-3.2.2/package
cp "$m/LICENSE" "$out/mathjax/"
mkdir -p "$out/mathjax/es5"
cp "$m/es5/tex-chtml.js" "$out/mathjax/es5/"
cp -r "$m/es5/input" "$m/es5/a11y" "$m/es5/ui" "$m/es5/adaptors" "$out/mathjax/es5/"
mkdir -p "$out/mathjax/es5/output"; cp -r "$m/es5/output/chtml" "$m/es5/output/chtml.js" "$out/mathjax/es5/output/"
du -sh "$out"
