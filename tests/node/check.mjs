// The check runner of the node serving tests: each check prints "ok: NAME"
// or "FAIL: NAME: why"; done() exits 1 when any failed.
let failed = 0;

export async function check(name, fn) {
  try {
    await fn();
    console.log('ok: ' + name);
  } catch (e) {
    failed++;
    console.log('FAIL: ' + name + ': ' + (e && e.stack || e));
  }
}

export function done() {
  if (failed) {
    console.log(failed + ' check(s) failed');
    process.exit(1);
  }
}
