// What the dashboard's browser tests share: Debian's Chromium started by playwright-core
// (a test tool's own browser download does not work on these machines), a fresh profile
// per run, and small helpers. Run by crates/baton/tests/it/ui.rs, which starts the cluster.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { chromium } from 'playwright-core';

export const CHROMIUM = '/usr/bin/chromium';

// Without the background-networking flags Chromium keeps dialling Google's hosts, which a
// closed network refuses; --no-sandbox because CI runs as root.
const ARGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
];

/** Chromium with a fresh, empty profile (playwright passes it as --user-data-dir). */
export async function launch() {
  if (!fs.existsSync(CHROMIUM)) {
    throw new Error(`${CHROMIUM} is missing: install Debian's chromium (scripts/install-deps)`);
  }
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'baton-ui-profile-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: ARGS,
    viewport: { width: 1280, height: 900 },
  });
  return {
    context,
    async close() {
      await context.close();
      fs.rmSync(profile, { recursive: true, force: true });
    },
  };
}

/** The settings the Rust test passes in the environment. */
export function settings() {
  const need = (name) => {
    const v = process.env[name];
    if (!v) throw new Error(`${name} is not set (run through crates/baton/tests/it/ui.rs)`);
    return v;
  };
  return {
    url: need('BATON_UI_URL'),
    artifacts: need('BATON_UI_ARTIFACTS'),
    expect: JSON.parse(need('BATON_UI_EXPECT')),
  };
}

export function check(ok, message) {
  if (!ok) throw new Error(`check failed: ${message}`);
}

export function same(actual, expected, what) {
  const a = JSON.stringify(actual);
  const e = JSON.stringify(expected);
  check(a === e, `${what}: got ${a}, expected ${e}`);
}

/** Lines from the Rust test, one at a time. */
const lines = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]();
export async function nextLine() {
  const { value, done } = await lines.next();
  if (done) throw new Error('the test closed stdin');
  return value;
}

/** What the page shows of lock `name`: holder key, token, TTL and the queue in order. */
export async function readLock(page, name) {
  return page.evaluate((name) => {
    const lock = [...document.querySelectorAll('article.lock')].find((a) => a.dataset.lock === name);
    if (!lock) return null;
    const holder = lock.querySelector('[data-holder-key]');
    return {
      holderKey: holder ? holder.dataset.holderKey : null,
      token: holder && holder.dataset.token !== undefined ? Number(holder.dataset.token) : null,
      ttl: lock.querySelector('.holder div:nth-child(4) dd')?.textContent ?? null,
      waiters: [...lock.querySelectorAll('li[data-waiter-key]')].map((li) => li.dataset.waiterKey),
      waiting: Number(lock.querySelector('.queue').dataset.waiters),
      text: lock.textContent,
    };
  }, name);
}

/** Waits until the live stream is connected. */
export async function waitLive(page) {
  await page.waitForSelector('#live[data-state="live"]', { timeout: 20000 });
}

/** Whether the page is wider than its viewport (it must not be, even on a phone). */
export async function overflows(page) {
  return page.evaluate(() => document.documentElement.scrollWidth > window.innerWidth + 1);
}
