package raftnode

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics holds the peer's Prometheus collectors. Raft's own state is read at scrape time (see Collect).
type metrics struct {
	applyLatency prometheus.Histogram
	fsmBatch     prometheus.Histogram
	fsmEntries   prometheus.Counter
	// lostWrites counts the writes in flight when this peer lost its leadership, by what was learned of them.
	lostWrites *prometheus.CounterVec
}

func newMetrics() *metrics {
	return &metrics{
		applyLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "skiff_raft_commit_seconds",
			Help:    "Time from proposing a write on this peer to its result (commit and apply, forwarding included).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		fsmBatch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "skiff_fsm_apply_batch_seconds",
			Help:    "Time the store spends applying one batch of committed log entries.",
			Buckets: prometheus.ExponentialBuckets(0.00001, 2, 16),
		}),
		fsmEntries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "skiff_fsm_applied_entries_total",
			Help: "Log entries applied to the store.",
		}),
		lostWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "skiff_raft_lost_leadership_writes_total",
			Help: "Writes in flight when this peer lost its leadership, by outcome: committed (answered with " +
				"the result), not_committed (proposed again to the next leader), unknown (answered 504).",
		}, []string{"outcome"}),
	}
}

func (m *metrics) observeApply(d time.Duration) { m.applyLatency.Observe(d.Seconds()) }

func (m *metrics) observeFSMBatch(d time.Duration, n int) {
	m.fsmBatch.Observe(d.Seconds())
	m.fsmEntries.Add(float64(n))
}

var (
	descState    = prometheus.NewDesc("skiff_raft_state", "1 for the Raft state this peer is in.", []string{"state"}, nil)
	descIndex    = prometheus.NewDesc("skiff_raft_index", "Raft indexes of this peer.", []string{"kind"}, nil)
	descRevision = prometheus.NewDesc("skiff_store_revision", "The store's current revision.", nil, nil)
	descKeys     = prometheus.NewDesc("skiff_store_keys", "Live keys in the store.", nil, nil)
	descWatchers = prometheus.NewDesc("skiff_store_watchers", "Open watch subscriptions on this peer's store.", nil, nil)
)

// Collector returns the peer's metrics for registration.
func (n *Node) Collector() prometheus.Collector { return (*nodeCollector)(n) }

type nodeCollector Node

func (c *nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descState, descIndex, descRevision, descKeys, descWatchers} {
		ch <- d
	}
	c.metrics.applyLatency.Describe(ch)
	c.metrics.fsmBatch.Describe(ch)
	c.metrics.fsmEntries.Describe(ch)
	c.metrics.lostWrites.Describe(ch)
}

func (c *nodeCollector) Collect(ch chan<- prometheus.Metric) {
	n := (*Node)(c)
	state := n.raft.State().String()
	for _, s := range []string{"Follower", "Candidate", "Leader", "Shutdown"} {
		v := 0.0
		if s == state {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(descState, prometheus.GaugeValue, v, s)
	}
	ch <- prometheus.MustNewConstMetric(descIndex, prometheus.GaugeValue, float64(n.raft.CommitIndex()), "commit")
	ch <- prometheus.MustNewConstMetric(descIndex, prometheus.GaugeValue, float64(n.store.AppliedIndex()), "applied")
	ch <- prometheus.MustNewConstMetric(descIndex, prometheus.GaugeValue, float64(n.raft.LastIndex()), "last")
	ch <- prometheus.MustNewConstMetric(descRevision, prometheus.GaugeValue, float64(n.store.Revision()))
	ch <- prometheus.MustNewConstMetric(descKeys, prometheus.GaugeValue, float64(n.store.Len()))
	ch <- prometheus.MustNewConstMetric(descWatchers, prometheus.GaugeValue, float64(n.store.Watchers()))
	c.metrics.applyLatency.Collect(ch)
	c.metrics.fsmBatch.Collect(ch)
	c.metrics.fsmEntries.Collect(ch)
	c.metrics.lostWrites.Collect(ch)
}
