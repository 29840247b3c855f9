package controller

import (
	"context"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// keyQueue is the work queue and worker loop every Skiff controller syncs through, as Kubernetes'
// controllers do: keys are object keys ("namespace/name", or a name), the queue never hands one key to two
// workers, and a key queued again while it syncs is synced once more after.
//
// A sync returns when to look at the key again (zero: not until something changes) or an error:
//   - an error that only means an informer has not caught up with the controller's own writes (a conflict,
//     or what behind says) is logged at debug and retried on the short "behind" backoff, since the informer
//     usually catches up within milliseconds;
//   - any other error is logged as a warning and retried on the failure backoff;
//   - a success resets both backoffs.
type keyQueue struct {
	queue workqueue.TypedRateLimitingInterface[string]
	// retryBehind paces the retries of syncs that failed because an informer was behind.
	retryBehind workqueue.TypedRateLimiter[string]
	cfg         queueConfig
}

// queueConfig says how a controller's keyQueue syncs.
type queueConfig struct {
	what    string // the kind of key, for logs: "deployment"
	workers int    // parallel syncs of different keys; 1 when zero
	logger  hclog.Logger
	sync    func(ctx context.Context, key string) (recheckIn time.Duration, err error)
	// failures paces retries after an error: Kubernetes' default controller rate limiter (5 ms doubling to
	// 1000 s per key, 10 retries a second overall) when nil.
	failures workqueue.TypedRateLimiter[string]
	// behind reports errors, beyond conflicts, that only mean an informer is behind; behindBase is the first
	// retry's delay for those (5 ms when zero), doubling to 100 s.
	behind     func(error) bool
	behindBase time.Duration
}

func newKeyQueue(cfg queueConfig) *keyQueue {
	if cfg.failures == nil {
		cfg.failures = workqueue.DefaultTypedControllerRateLimiter[string]()
	}
	if cfg.behindBase == 0 {
		cfg.behindBase = 5 * time.Millisecond
	}
	if cfg.workers < 1 {
		cfg.workers = 1
	}
	if cfg.logger == nil {
		cfg.logger = hclog.NewNullLogger()
	}
	return &keyQueue{
		queue:       workqueue.NewTypedRateLimitingQueue(cfg.failures),
		retryBehind: workqueue.NewTypedItemExponentialFailureRateLimiter[string](cfg.behindBase, 100*time.Second),
		cfg:         cfg,
	}
}

// add queues a key to sync as soon as a worker is free; addAfter, after a delay.
func (q *keyQueue) add(key string)                       { q.queue.Add(key) }
func (q *keyQueue) addAfter(key string, d time.Duration) { q.queue.AddAfter(key, d) }

// addObject queues an informer object (or its tombstone) by its key.
func (q *keyQueue) addObject(obj any) {
	if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
		q.queue.Add(key)
	}
}

// forget drops the backoffs of a key that is gone.
func (q *keyQueue) forget(key string) {
	q.queue.Forget(key)
	q.retryBehind.Forget(key)
}

func (q *keyQueue) shutDown() { q.queue.ShutDown() }

// run starts the shared informers, waits until those in synced have synced, and syncs keys until ctx ends;
// then it shuts the queue down.
func (q *keyQueue) run(ctx context.Context, c *Clients, synced ...cache.InformerSynced) {
	defer q.shutDown()
	go func() {
		<-ctx.Done()
		q.shutDown()
	}()
	c.Informers.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return
	}
	var workers sync.WaitGroup
	for range q.cfg.workers {
		workers.Go(func() {
			for q.processNext(ctx) {
			}
		})
	}
	workers.Wait()
}

// processNext syncs one key; it returns false once the queue is shut down.
func (q *keyQueue) processNext(ctx context.Context) bool {
	key, quit := q.queue.Get()
	if quit {
		return false
	}
	defer q.queue.Done(key)
	recheckIn, err := q.cfg.sync(ctx, key)
	switch {
	case err != nil && ctx.Err() != nil:
		// Leadership ended mid-sync: the next leader syncs every key anyway.
	case err != nil && (apierrors.IsConflict(err) || (q.cfg.behind != nil && q.cfg.behind(err))):
		q.cfg.logger.Debug("sync failed, retrying", q.cfg.what, key, "error", err)
		q.queue.AddAfter(key, q.retryBehind.When(key))
	case err != nil:
		q.cfg.logger.Warn("sync failed, retrying", q.cfg.what, key, "error", err)
		q.queue.AddRateLimited(key)
	default:
		q.forget(key)
		if recheckIn > 0 {
			q.queue.AddAfter(key, recheckIn)
		}
	}
	return true
}
