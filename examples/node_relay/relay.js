// A minimal WebSocket relay (the comparison baseline of `loadgen --plain-relay`): the two sockets
// dialled to /a/<key> and /b/<key> are paired and every message is forwarded as it is (text or
// binary). Nagle off, no compression. Messages arriving before the peer are queued.
const { WebSocketServer } = require('ws');

const wss = new WebSocketServer({ port: +(process.env.PORT || 0), perMessageDeflate: false });
const waiting = new Map();

wss.on('connection', (ws, req) => {
  ws._socket.setNoDelay(true);
  const key = req.url.slice(3);
  const queue = [];
  const early = (data, isBinary) => queue.push([data, isBinary]);
  ws.on('message', early);
  const peer = waiting.get(key);
  if (!peer) {
    waiting.set(key, { ws, queue, early });
    ws.on('close', () => { if (waiting.get(key)?.ws === ws) waiting.delete(key); });
    return;
  }
  waiting.delete(key);
  link({ ws, queue, early }, peer);
  link(peer, { ws, queue, early });
});

function link(from, to) {
  from.ws.off('message', from.early);
  for (const [d, b] of from.queue) to.ws.send(d, { binary: b });
  from.queue.length = 0;
  from.ws.on('message', (d, b) => to.ws.send(d, { binary: b }));
  from.ws.on('close', () => to.ws.close());
}

wss.on('listening', () => console.log(`listening on ${wss.address().port}`));
