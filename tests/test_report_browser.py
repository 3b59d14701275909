"""The quickstart's HTML report rendered in headless Chromium (Debian's `chromium`).

Driven over the DevTools protocol (aiohttp websocket): the page loads from a file with networking
disabled, no console error or exception occurs, the verdict and every plot are in the DOM as inline
SVG, the SIMULATED banner shows, and a full-page screenshot is saved (path printed; a copy kept at
/tmp/truthput-report.png). Skips with the reason where Chromium is absent.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

FIXTURE = Path(__file__).parent / "fixtures" / "report" / "quickstart.sql.gz"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SCREENSHOT_COPY = Path("/tmp/truthput-report.png")
PLOTS = ("throughput", "tradeoff", "per_stream", "latency", "acceptance", "roofline")


def _store(tmp_path: Path):
    from truthput.store.db import Store

    db = tmp_path / "q.db"
    conn = sqlite3.connect(db)
    conn.executescript(gzip.decompress(FIXTURE.read_bytes()).decode())
    conn.close()
    return Store(db)


async def _devtools(html_path: Path, profile: Path, shot: Path) -> dict:
    import aiohttp

    proc = subprocess.Popen(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>",
         f"--user-data-dir={profile}", "--remote-debugging-port=0", "--window-size=1200,900", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"chromium did not open its DevTools port (exit {proc.poll()})")
            await asyncio.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/json/list") as resp:
                targets = await resp.json()
            page = next(t for t in targets if t["type"] == "page")
            async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                ids = iter(range(1, 10_000))
                events: list[dict] = []

                async def call(method: str, **params) -> dict:
                    i = next(ids)
                    await ws.send_json({"id": i, "method": method, "params": params})
                    while True:
                        msg = json.loads((await ws.receive(timeout=30)).data)
                        if msg.get("id") == i:
                            if "error" in msg:
                                raise RuntimeError(f"{method}: {msg['error']}")
                            return msg.get("result", {})
                        events.append(msg)

                for domain in ("Page", "Runtime", "Log"):
                    await call(f"{domain}.enable")
                await call("Page.navigate", url=html_path.as_uri())
                deadline = time.monotonic() + 30
                while not any(e.get("method") == "Page.loadEventFired" for e in events):
                    if time.monotonic() > deadline:
                        raise RuntimeError("page did not finish loading in 30 s")
                    events.append(json.loads((await ws.receive(timeout=30)).data))
                probe = """JSON.stringify({
                  verdict: (document.querySelector('#verdict .verdict') || {}).innerText || '',
                  banner: (document.querySelector('#simulated-banner') || {}).innerText || '',
                  plots: Array.from(document.querySelectorAll('figure.plot')).map(f => ({
                      id: f.dataset.plot, svg: !!f.querySelector('svg'),
                      w: f.querySelector('svg') ? f.querySelector('svg').getBoundingClientRect().width : 0})),
                  scripts: document.querySelectorAll('script').length,
                  height: document.documentElement.scrollHeight,
                  pageWidth: document.documentElement.scrollWidth, viewWidth: window.innerWidth,
                  wideTables: Array.from(document.querySelectorAll('table')).filter(
                      t => t.getBoundingClientRect().right > window.innerWidth + 1).map(t => t.id || t.innerText.slice(0, 60)),
                  clipped: [], overprinted: []})"""
                # every text the browser drew in a plot: inside its SVG, and clear of the others
                texts_probe = """(() => { const clipped = [], over = [];
                  for (const fig of document.querySelectorAll('figure.plot')) {
                    const svg = fig.querySelector('svg'); if (!svg) continue;
                    const box = svg.getBoundingClientRect();
                    const rects = Array.from(svg.querySelectorAll('text')).filter(t => t.textContent.trim())
                      .map(t => [t.textContent.trim(), t.getBoundingClientRect()]).filter(([_, r]) => r.width > 0);
                    for (const [s, r] of rects)
                      if (r.left < box.left - 1 || r.right > box.right + 1 || r.top < box.top - 1 || r.bottom > box.bottom + 1)
                        clipped.push(fig.dataset.plot + ': ' + s);
                    for (let i = 0; i < rects.length; i++) for (let j = i + 1; j < rects.length; j++) {
                      const a = rects[i][1], b = rects[j][1];
                      const w = Math.min(a.right, b.right) - Math.max(a.left, b.left);
                      const h = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
                      if (w > 1 && h > 1) over.push(fig.dataset.plot + ': ' + rects[i][0] + ' / ' + rects[j][0]);
                    } }
                  return JSON.stringify({clipped: clipped, overprinted: over}); })()"""
                res = await call("Runtime.evaluate", expression=probe, returnByValue=True)
                info = json.loads(res["result"]["value"])
                res = await call("Runtime.evaluate", expression=texts_probe, returnByValue=True)
                info.update(json.loads(res["result"]["value"]))
                await call("Emulation.setDeviceMetricsOverride", width=1200, height=min(info["height"], 16000),
                           deviceScaleFactor=1, mobile=False)
                png = await call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
                shot.write_bytes(base64.b64decode(png["data"]))
                await asyncio.sleep(0.2)
                while True:  # drain late events
                    try:
                        events.append(json.loads((await ws.receive(timeout=0.3)).data))
                    except (asyncio.TimeoutError, TypeError, json.JSONDecodeError):
                        break
        errors = []
        for e in events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.exceptionThrown":
                errors.append(p["exceptionDetails"].get("text"))
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                errors.append(str(p.get("args")))
            elif m == "Log.entryAdded" and p["entry"].get("level") == "error":
                errors.append(p["entry"].get("text"))
        info["errors"] = errors
        return info
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install -y chromium)")
@pytest.mark.timeout(120)
def test_quickstart_report_renders_in_chromium(tmp_path):
    from truthput.report.data import build_report_data
    from truthput.report.files import ReportTargets, write_reports

    store = _store(tmp_path)
    rid = store.resolve_run("latest")
    html_path, _md = write_reports(build_report_data(store, rid), ReportTargets.run_folder(tmp_path / "reports", rid))
    shot = tmp_path / "truthput-report.png"
    info = asyncio.run(_devtools(html_path, tmp_path / "profile", shot))

    assert info["errors"] == [], f"console errors: {info['errors']}"
    assert info["scripts"] == 0
    assert "SIMULATED" in info["banner"]
    # the verdict the run stored: c=1 nospec is slower by -54% (the fixture's known outcome)
    assert "c=1: nospec is 54% slower than original" in info["verdict"]
    assert "no winner: original stays" in info["verdict"]
    plots = {p["id"]: p for p in info["plots"]}
    for name in PLOTS:
        assert name in plots and plots[name]["svg"], f"plot {name} missing"
        assert plots[name]["w"] > 300, f"plot {name} rendered {plots[name]['w']} px wide"
    # nothing runs off the page or out of its plot, and no text of a plot sits on another
    assert info["pageWidth"] <= info["viewWidth"] + 1 and not info["wideTables"], (info["pageWidth"],
                                                                                  info["wideTables"])
    assert info["clipped"] == [], info["clipped"]
    assert info["overprinted"] == [], info["overprinted"]
    assert shot.stat().st_size > 50_000
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    try:
        shutil.copy(shot, SCREENSHOT_COPY)
    except OSError:
        pass
    print(f"\nscreenshot: {shot} (copy: {SCREENSHOT_COPY})")
