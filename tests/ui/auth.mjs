// The dashboard with auth on (set up by crates/baton/tests/it/ui.rs): an anonymous visitor
// gets the login page and nothing of the cluster (not the page, not the event stream); a
// wrong password is refused; root logs in and sees the lock; the session cookie is HttpOnly
// and SameSite=Strict; a user without the root role sees the members but not the lock
// registry (the server's permission checks apply to the visitor); logging out ends it.
import path from 'node:path';
import { check, launch, readLock, same, settings, waitLive } from './browser.mjs';

const { url, artifacts, expect } = settings();
const shot = (name) => path.join(artifacts, name);

async function logIn(page, user, password) {
  await page.fill('input[name="user"]', user);
  await page.fill('input[name="password"]', password);
  await Promise.all([page.waitForNavigation(), page.click('button[type="submit"]')]);
}

const { context, close } = await launch();
try {
  const page = context.pages()[0] ?? (await context.newPage());
  await page.goto(`${url}/ui`);
  check(page.url().endsWith('/ui/login'), `anonymous is sent to log in (at ${page.url()})`);
  const body = await page.textContent('body');
  for (const secret of [expect.lock, expect.holder, ...expect.members]) {
    check(!body.includes(secret), `the login page shows nothing of the cluster (found ${secret})`);
  }
  const stream = await context.request.get(`${url}/ui/events`);
  same(stream.status(), 401, 'the event stream without a session');
  await page.screenshot({ path: shot('login.png') });

  await logIn(page, 'root', 'wrong password');
  check(page.url().endsWith('/ui/login'), 'a wrong password stays on the login page');
  check((await page.textContent('.error')).includes('authentication failed'), 'says why');

  await logIn(page, 'root', expect.rootPassword);
  check(page.url().endsWith('/ui'), `root is let in (at ${page.url()})`);
  await waitLive(page);
  const lock = await readLock(page, expect.lock);
  same(lock?.holderKey, expect.holder, 'root sees the holder');
  same(lock.token, expect.token, 'and its token');
  check((await page.textContent('.logout .user')) === 'root', 'the page names the user');
  const cookie = (await context.cookies()).find((c) => c.name === 'baton_ui_token');
  check(cookie && cookie.httpOnly && cookie.sameSite === 'Strict' && cookie.path === '/ui',
    `session cookie attributes: ${JSON.stringify({ ...cookie, value: '<hidden>' })}`);
  await page.screenshot({ path: shot('after-login.png'), fullPage: true });

  // Logging out ends the session: the page asks for a login again.
  await Promise.all([page.waitForNavigation(), page.click('.logout button')]);
  check(page.url().endsWith('/ui/login'), 'logged out');
  await page.goto(`${url}/ui`);
  check(page.url().endsWith('/ui/login'), 'and /ui asks for a login again');

  // A user without the root role reads as itself: members yes, the lock registry no.
  await logIn(page, expect.viewer, expect.viewerPassword);
  await waitLive(page);
  same((await page.$$('tr[data-member]')).length, expect.members.length, 'the viewer sees the members');
  const locks = await page.textContent('#locks');
  check(locks.includes('permission denied') && !locks.includes(expect.holder),
    `the viewer is refused the lock registry: ${locks}`);
  console.log('OK');
} finally {
  await close();
}
