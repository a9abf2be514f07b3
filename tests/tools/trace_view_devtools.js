// trace_view_devtools.js — open an mpirpc trace (Chrome trace-event JSON) in a real viewer, Chromium's
// own DevTools Performance panel, headless, and save screenshots; for a machine without a display or
// network (Perfetto's UI needs the network; Chromium 156 has no chrome://tracing any more).
//
// Needs: chromium (Debian: apt-get install chromium) and puppeteer-core (npm install puppeteer-core,
// PUPPETEER_SKIP_DOWNLOAD=1), and the trace served over HTTP (python3 -m http.server).
// usage: node trace_view_devtools.js http://127.0.0.1:8765/ps.json OUT.png
//   env CLICKS='[[x,y],...]'  clicks after loading (e.g. on the processes' triangles, bottom one first,
//                              to open their thread tracks), DRAG='[x0,y,x1]' a drag in the overview
//                              strip (selects the time window). Coordinates are in the 1900x1150 window.
// Writes OUT_0.png (as loaded), OUT_1.png (sidebar and drawer closed) and OUT.png (after CLICKS, DRAG).
// How: --auto-open-devtools-for-tabs opens DevTools on a blank tab; in the DevTools page the script
// undocks it, shows the Performance panel and calls its loadFromURL (DevTools' own module), which
// parses the file as a trace; the rest is mouse input. DevTools draws one group per process (rank)
// and one track per thread with the slices nested; it does not draw the trace's flow arrows.
const puppeteer = require('puppeteer-core');
const [url, out] = process.argv.slice(2);
if (!url || !out) {
  console.error('usage: node trace_view_devtools.js URL_OF_TRACE OUT.png');
  process.exit(2);
}
const sleep = ms => new Promise(r => setTimeout(r, ms));
(async () => {
  const browser = await puppeteer.launch({executablePath: process.env.CHROMIUM || '/usr/bin/chromium', headless: 'new',
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--auto-open-devtools-for-tabs', '--window-size=1900,1200']});
  try {
    const page = await browser.newPage();
    await page.goto('about:blank');
    await sleep(4000);
    const dt = browser.targets().filter(t => t.url().startsWith('devtools://')).pop();
    if (!dt) throw new Error('no DevTools target opened');
    const dpage = await dt.asPage();
    await sleep(8000); // DevTools' own start-up (several seconds on a loaded machine)
    const r = await dpage.evaluate(async (url) => {
      try {
        const UI = await import('devtools://devtools/bundled/ui/legacy/legacy.js');
        UI.DockController.DockController.instance().setDockSide('undocked');
        await UI.ViewManager.ViewManager.instance().showView('timeline');
        const T = await import('devtools://devtools/bundled/panels/timeline/timeline.js');
        await T.TimelinePanel.TimelinePanel.instance().loadFromURL(url);
        return 'loaded';
      } catch (e) { return 'error: ' + e.stack; }
    }, url);
    if (r !== 'loaded') throw new Error(r);
    await sleep(12000);
    await dpage.setViewport({width: 1900, height: 1150});
    await dpage.keyboard.press('Escape'); // the keyboard-shortcuts dialog
    await sleep(1000);
    await dpage.screenshot({path: out.replace(/\.png$/, '_0.png')});
    await dpage.mouse.click(1880, 962); // close the console drawer
    await sleep(500);
    await dpage.mouse.click(15, 39);    // hide the sidebar
    await sleep(1000);
    await dpage.screenshot({path: out.replace(/\.png$/, '_1.png')});
    for (const [x, y] of JSON.parse(process.env.CLICKS || '[]')) { await dpage.mouse.click(x, y); await sleep(700); }
    const drag = JSON.parse(process.env.DRAG || 'null');
    if (drag) {
      await dpage.mouse.move(drag[0], drag[1]);
      await dpage.mouse.down();
      await dpage.mouse.move(drag[2], drag[1], {steps: 10});
      await dpage.mouse.up();
      await sleep(1500);
    }
    await dpage.mouse.move(5, 1140);
    await sleep(500);
    await dpage.screenshot({path: out});
    console.log(`trace_view_devtools.js: ${url} -> ${out}`);
  } finally {
    await browser.close();
  }
})().catch(e => { console.error('trace_view_devtools.js:', e.message); process.exit(1); });
