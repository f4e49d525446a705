// The dashboard against a real 3-member cluster with a contended lock (set up by
// crates/baton/tests/it/ui.rs): the page shows the members, the holder, the waiters in queue
// order and the fencing token, the election, the lease and its keys, stuck sagas/2PC first;
// it fits a phone's width; and when the test releases the holder, the same page (no reload)
// shows the next holder, its token and the shorter queue. Screenshots go to
// $BATON_UI_ARTIFACTS. Protocol with the test: prints RELEASE, reads one line of JSON (the
// new holder, token and waiters), prints OK at the end.
import path from 'node:path';
import { check, launch, nextLine, overflows, readLock, same, settings, waitLive } from './browser.mjs';

const { url, artifacts, expect } = settings();
const shot = (name) => path.join(artifacts, name);
const { context, close } = await launch();
try {
  const page = context.pages()[0] ?? (await context.newPage());
  await page.goto(`${url}/ui`);
  check(page.url().endsWith('/ui'), `stayed on /ui (got ${page.url()})`);
  await waitLive(page);

  // Members: every one, one leader, each healthy, the one we look through with its watchers.
  // The watcher count comes from the member's /metrics, scraped with a 1 s bound and read
  // again every 5 s: on a loaded machine the first scrape may miss, and the page shows the
  // count at the next reading — wait for it as a user would (the check below still fails if
  // it never comes).
  await page
    .waitForFunction(
      (name) => /^\d+$/.test(
        document.querySelector(`tr[data-member="${name}"] [data-watchers]`)?.dataset.watchers ?? ''),
      expect.viewedMember,
      { timeout: 15000 })
    .catch(() => {});
  const members = await page.$$eval('tr[data-member]', (rows) =>
    rows.map((r) => ({
      name: r.dataset.member,
      role: r.dataset.role,
      health: r.querySelector('.badge').textContent,
      watchers: r.querySelector('[data-watchers]').dataset.watchers,
    })));
  same(members.map((m) => m.name).sort(), expect.members, 'member names');
  same(members.filter((m) => m.role === 'leader').length, 1, 'leaders');
  check(members.every((m) => m.health === 'healthy'), `all healthy: ${JSON.stringify(members)}`);
  const viewed = members.find((m) => m.name === expect.viewedMember);
  check(/^\d+$/.test(viewed.watchers) && Number(viewed.watchers) >= 1,
    `${expect.viewedMember} shows its watchers: ${viewed.watchers}`);

  // The contended lock: holder, token, TTL, lock-delay, queue in order.
  const lock = await readLock(page, expect.lock);
  check(lock !== null, `lock ${expect.lock} is shown`);
  same(lock.holderKey, expect.holder, 'holder key');
  same(lock.token, expect.token, 'fencing token');
  check(/^\d+s$/.test(lock.ttl), `TTL left shown: ${lock.ttl}`);
  same(lock.waiters, expect.waiters, 'waiters in queue order');
  same(lock.waiting, expect.waiters.length, 'waiter count');
  check(lock.text.includes(`lock-delay ${expect.lockDelay}`), `lock-delay shown: ${lock.text}`);

  // The election with its leader and value; the lease with its keys.
  const election = await page.$eval(`tr[data-election="${expect.election}"]`, (r) => ({
    leader: r.querySelector('[data-leader-key]').dataset.leaderKey,
    text: r.textContent,
  }));
  same(election.leader, expect.electionLeaderKey, 'election leader');
  check(election.text.includes(expect.electionValue), `election value: ${election.text}`);
  const lease = await page.$eval(`tr[data-lease="${expect.lease}"]`, (r) =>
    [...r.querySelectorAll('.chip')].map((c) => c.textContent));
  same(lease, expect.leaseKeys, 'lease keys');

  // Sagas and 2PC: stuck ones first.
  const txns = await page.$$eval('tr[data-txn]', (rows) =>
    rows.map((r) => ({ id: r.dataset.txn, stuck: r.classList.contains('stuck') })));
  same(txns.slice(0, expect.stuckTxns.length).map((t) => t.stuck), expect.stuckTxns.map(() => true),
    'stuck rows first');
  same(txns.slice(0, expect.stuckTxns.length).map((t) => t.id).sort(), [...expect.stuckTxns].sort(),
    'the stuck ones');
  check(txns.some((t) => t.id === expect.runningSaga && !t.stuck), 'the running saga is listed');

  await page.screenshot({ path: shot('dashboard-desktop.png'), fullPage: true });

  // A phone: the page fits its width (wide tables scroll in their box).
  const phone = await context.newPage();
  await phone.setViewportSize({ width: 390, height: 844 });
  await phone.goto(`${url}/ui`);
  await waitLive(phone);
  check(!(await overflows(phone)), 'the page is no wider than a phone');
  same((await readLock(phone, expect.lock)).holderKey, expect.holder, 'holder on the phone');
  await phone.screenshot({ path: shot('dashboard-phone.png'), fullPage: true });
  await phone.close();

  // The holder releases: the open page follows without a reload.
  await page.evaluate(() => { window.__sameDocument = 'yes'; });
  const updatesBefore = Number(await page.evaluate(() => document.body.dataset.updates ?? '0'));
  console.log('RELEASE');
  const after = JSON.parse(await nextLine());
  await page.waitForFunction(
    ([name, key]) => {
      const lock = [...document.querySelectorAll('article.lock')].find((a) => a.dataset.lock === name);
      return lock?.querySelector('[data-holder-key]')?.dataset.holderKey === key;
    },
    [expect.lock, after.holder],
    { timeout: 15000 },
  );
  const now = await readLock(page, expect.lock);
  same(now.token, after.token, 'the new fencing token');
  check(now.token > expect.token, 'tokens grow');
  same(now.waiters, after.waiters, 'the shorter queue');
  same(await page.evaluate(() => window.__sameDocument), 'yes', 'no reload');
  const updatesAfter = Number(await page.evaluate(() => document.body.dataset.updates ?? '0'));
  check(updatesAfter > updatesBefore, `updated by the stream (${updatesBefore} -> ${updatesAfter})`);
  await page.screenshot({ path: shot('dashboard-after-release.png'), fullPage: true });
  console.log('OK');
} finally {
  await close();
}
