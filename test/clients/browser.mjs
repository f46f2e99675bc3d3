// A real browser on the example's order page: headless Debian chromium,
// driven by playwright-core, double-clicks "Submit order", then edits the
// quantity and submits again (a new intent: a new key).  Prints what the
// page shows, as JSON, and saves a screenshot.
//
//   node test/clients/browser.mjs URL SCREENSHOT.png
import { chromium } from 'playwright-core';

const [url, shot] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
         '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
try {
  const page = await browser.newPage();
  const posts = [];
  page.on('response', (r) => { if (r.url().endsWith('/api/orders')) posts.push(r.status()); });
  await page.goto(url);
  await page.dblclick('#submit');          // two clicks (and a dblclick event) as a user's double click
  await page.waitForFunction(() => document.querySelectorAll('#log li').length >= 2, null, { timeout: 15000 });
  const key = await page.textContent('#key');
  await page.fill('#qty', '3');            // the order edited: a second intent
  const second = await page.textContent('#key');
  await page.click('#submit');
  await page.waitForFunction(() => document.querySelectorAll('#log li').length >= 3, null, { timeout: 15000 });
  const lines = await page.$$eval('#log li', (items) => items.map((i) => ({ cls: i.className, text: i.textContent,
    key: i.dataset.key })));
  await page.screenshot({ path: shot, fullPage: true });
  console.log(JSON.stringify({ key, second, posts, lines }));
} finally {
  await browser.close();
}
