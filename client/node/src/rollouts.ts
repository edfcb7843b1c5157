import * as grpc from '@grpc/grpc-js';
import { StreambpError, toStreambpError } from './errors';
import { AsyncQueue } from './queue';
import type { RolloutAck__Output, RolloutGroup } from './generated';

const METHOD = 'PushRolloutsStream';

/**
 * One PushRolloutsStream: push rollout groups as they are ready; the server acknowledges
 * each once it is durably queued, in order. Not retried by itself: after a failure, open a
 * new stream and push again the groups whose acks did not arrive (a group_id makes a
 * repeated push harmless: its ack says "duplicate").
 *
 *   const stream = client.pushRolloutsStream();
 *   const ack = await stream.push(group);          // this group's ack
 *   for await (const ack of stream.acks()) { ... } // or: every ack from now on
 *   await stream.end();                            // half-close, wait for the remaining acks
 */
export class RolloutStream {
  private readonly pending: Array<{ resolve: (a: RolloutAck__Output) => void; reject: (e: unknown) => void }> = [];
  private readonly taps: Array<AsyncQueue<RolloutAck__Output>> = [];
  private readonly finished: Promise<void>;
  private failure: StreambpError | undefined;
  private ended = false;

  /** @internal Made by Client.pushRolloutsStream. */
  constructor(private readonly call: grpc.ClientDuplexStream<RolloutGroup, RolloutAck__Output>,
              private readonly prepare: (group: RolloutGroup) => RolloutGroup) {
    this.finished = new Promise<void>((resolve, reject) => {
      call.on('data', (ack: RolloutAck__Output) => {
        this.pending.shift()?.resolve(ack);
        for (const tap of this.taps) tap.push(ack);
      });
      call.on('error', (e: unknown) => {
        this.failure = toStreambpError(e, METHOD);
        this.settle(this.failure);
        reject(this.failure);
      });
      call.on('status', (status: grpc.StatusObject) => {
        if (status.code !== grpc.status.OK) return;  // 'error' reports it
        this.settle(new StreambpError(grpc.status.DATA_LOSS, 'the stream ended before every pushed group was acknowledged',
                                      { method: METHOD }));
        resolve();
      });
    });
    this.finished.catch(() => undefined);  // reported by end(), push() and acks()
  }

  /** Sends a group (the client's session fills an unset `session`); resolves with its ack. */
  push(group: RolloutGroup): Promise<RolloutAck__Output> {
    if (this.failure) return Promise.reject(this.failure);
    if (this.ended) {
      return Promise.reject(new StreambpError(grpc.status.FAILED_PRECONDITION, 'push() after end()', { method: METHOD }));
    }
    const acked = new Promise<RolloutAck__Output>((resolve, reject) => this.pending.push({ resolve, reject }));
    acked.catch(() => undefined);  // a caller that does not wait for acks learns of failures from end()
    this.call.write(this.prepare(group));
    return acked;
  }

  /** Every ack that arrives from now on, in order; ends when the stream does, throws its error. */
  acks(): AsyncIterableIterator<RolloutAck__Output> {
    const tap = new AsyncQueue<RolloutAck__Output>();
    if (this.failure) tap.fail(this.failure);
    else this.taps.push(tap);
    return tap;
  }

  /** Groups pushed and not yet acknowledged. */
  get unacknowledged(): number {
    return this.pending.length;
  }

  /** Half-closes the stream; resolves once the server has acknowledged everything and closed. */
  end(): Promise<void> {
    if (!this.ended) {
      this.ended = true;
      this.call.end();
    }
    return this.finished;
  }

  /** Abandons the stream (CANCELLED for what is still waiting). */
  cancel(): void {
    this.call.cancel();
  }

  private settle(error: StreambpError): void {
    for (const p of this.pending.splice(0)) p.reject(error);
    for (const tap of this.taps.splice(0)) {
      if (error.code === grpc.status.DATA_LOSS) tap.close();
      else tap.fail(error);
    }
  }
}
