// Preloaded with `node --require` by kinesis_dstream.local: forces every TCP listener of the
// emulator onto 127.0.0.1 (kinesis-local and kinesalite have no host option and would bind
// 0.0.0.0), and exits when the Python process that started it is gone, so a killed test run
// leaves no stray emulator behind.
'use strict';
const net = require('net');
const HOST = process.env.KINESIS_DSTREAM_LISTEN_HOST || '127.0.0.1';
const originalListen = net.Server.prototype.listen;

net.Server.prototype.listen = function (...args) {
  const first = args[0];
  if (first !== null && typeof first === 'object' && !Array.isArray(first)) {
    // listen(options[, backlog][, cb]); a handle or a unix path is left alone
    if (first.path === undefined && first.handle === undefined && first._handle === undefined
        && first.fd === undefined) {
      args[0] = Object.assign({}, first, { host: HOST });
    }
  } else if (typeof first === 'number' || (typeof first === 'string' && /^\d+$/.test(first))) {
    // listen(port[, host][, backlog][, cb])
    if (typeof args[1] === 'string') {
      args[1] = HOST;
    } else {
      args.splice(1, 0, HOST);
    }
  } else if (first === undefined || typeof first === 'function') {
    // listen([cb]): a random port on every address
    args.unshift(0, HOST);
  }
  return originalListen.apply(this, args);
};

if (process.env.KINESIS_DSTREAM_EXIT_WITH_PARENT === '1') {
  const parent = process.ppid;
  setInterval(() => {
    if (process.ppid !== parent) process.exit(0);
  }, 500).unref();
}
