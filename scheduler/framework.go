package scheduler

import (
	"context"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Code is the outcome of a plugin.
type Code int

const (
	// Success: the node passes. A nil *Status means Success.
	Success Code = iota
	// Unschedulable: the node fails, but removing pods from it (preemption) might help.
	Unschedulable
	// UnschedulableAndUnresolvable: the node fails and preemption cannot help.
	UnschedulableAndUnresolvable
	// Error: the plugin itself failed.
	Error
)

// Status is a plugin's verdict. A nil Status is a success.
type Status struct {
	code    Code
	reasons []string
}

// NewStatus returns a status with a code and the reasons a user reads in FailedScheduling.
func NewStatus(code Code, reasons ...string) *Status { return &Status{code: code, reasons: reasons} }

// Code returns the status code; nil is Success.
func (s *Status) Code() Code {
	if s == nil {
		return Success
	}
	return s.code
}

// IsSuccess reports whether the status is a success.
func (s *Status) IsSuccess() bool { return s.Code() == Success }

// Reasons returns the reasons.
func (s *Status) Reasons() []string {
	if s == nil {
		return nil
	}
	return s.reasons
}

func (s *Status) String() string {
	if s == nil {
		return "Success"
	}
	return strings.Join(s.reasons, ", ")
}

// MaxNodeScore is the highest score a plugin gives a node after normalization.
const MaxNodeScore int64 = 100

// Plugin is the base of every plugin.
type Plugin interface {
	Name() string
}

// PreFilterPlugin computes, once per pod, the state its Filter and Score need (for example the pods that
// match an affinity term in each topology domain). It stores the state in the CycleState.
type PreFilterPlugin interface {
	Plugin
	PreFilter(ctx context.Context, state *CycleState, pod *corev1.Pod, nodes []*NodeInfo) *Status
}

// FilterPlugin decides whether a pod may run on a node.
type FilterPlugin interface {
	Plugin
	Filter(ctx context.Context, state *CycleState, pod *corev1.Pod, node *NodeInfo) *Status
}

// ScorePlugin ranks a feasible node. Plugins whose raw scores are not already 0-100 also implement
// ScoreNormalizer.
type ScorePlugin interface {
	Plugin
	Score(ctx context.Context, state *CycleState, pod *corev1.Pod, node *NodeInfo) (int64, *Status)
}

// PreScorePlugin computes, once per pod, the state its Score needs, over the feasible nodes.
type PreScorePlugin interface {
	Plugin
	PreScore(ctx context.Context, state *CycleState, pod *corev1.Pod, feasible []*NodeInfo) *Status
}

// ScoreNormalizer rescales a plugin's raw scores over all feasible nodes to 0-100.
type ScoreNormalizer interface {
	NormalizeScore(ctx context.Context, state *CycleState, pod *corev1.Pod, scores []NodeScore) *Status
}

// NodeScore is one node's score.
type NodeScore struct {
	Name  string
	Score int64
}

// CycleState holds what plugins compute for one pod during one scheduling cycle. Filters may run on many
// nodes at once, so plugins write it only in PreFilter and PreScore.
type CycleState struct {
	// PodInfo is the pod being scheduled, with its requests, ports and affinity terms computed.
	PodInfo *PodInfo
	// NamespaceLabels returns a namespace's labels, for affinity terms with a namespaceSelector.
	NamespaceLabels func(namespace string) labels.Set
	// NodeCount and ImageNodes (how many nodes hold each image) describe the whole cluster.
	NodeCount  int
	ImageNodes map[string]int
	// Claims reads persistent volume claims, volumes and classes; nil where none are served (tests).
	Claims   ClaimSource
	allNodes []*NodeInfo
	// podIndex finds the pods a selector may match (the cache's label index); nil when the nodes are
	// what-if copies (preemption), and plugins look at every pod of allNodes instead.
	podIndex  podIndex
	nominated map[string][]*PodInfo // pods nominated to each node ahead of this one
	data      map[string]any
}

// podIndex finds the pods that a selector may match; see Snapshot.candidates.
type podIndex interface {
	candidates(sel labels.Selector) ([]podOnNode, bool)
	domains(key string) map[string]int
}

// NewCycleState returns the state for scheduling one pod.
func NewCycleState(info *PodInfo, nsLabels func(string) labels.Set) *CycleState {
	if nsLabels == nil {
		nsLabels = func(string) labels.Set { return nil }
	}
	// Affinity plugins ask for the labels of every existing pod's namespace; remember them for the cycle.
	memo := map[string]labels.Set{}
	memoized := func(ns string) labels.Set {
		l, ok := memo[ns]
		if !ok {
			l = nsLabels(ns)
			memo[ns] = l
		}
		return l
	}
	return &CycleState{PodInfo: info, NamespaceLabels: memoized, data: map[string]any{}}
}

// Write stores a plugin's value.
func (c *CycleState) Write(key string, v any) { c.data[key] = v }

// Read returns a plugin's value, or nil.
func (c *CycleState) Read(key string) any { return c.data[key] }

// weightedScorer is a score plugin with its weight in the total.
type weightedScorer struct {
	plugin ScorePlugin
	weight int64
}

// defaultNormalize rescales scores so that the highest becomes 100 (or, reversed, the highest becomes 0).
func defaultNormalize(scores []NodeScore, reverse bool) {
	var max int64
	for _, s := range scores {
		if s.Score > max {
			max = s.Score
		}
	}
	for i := range scores {
		switch {
		case max == 0 && reverse:
			scores[i].Score = MaxNodeScore
		case max == 0:
			scores[i].Score = 0
		default:
			scores[i].Score = scores[i].Score * MaxNodeScore / max
			if reverse {
				scores[i].Score = MaxNodeScore - scores[i].Score
			}
		}
	}
}

// minMaxNormalize maps the lowest score to 0 and the highest to 100, for scores that may be negative.
func minMaxNormalize(scores []NodeScore) {
	if len(scores) == 0 {
		return
	}
	lo, hi := scores[0].Score, scores[0].Score
	for _, s := range scores {
		lo, hi = min(lo, s.Score), max(hi, s.Score)
	}
	for i := range scores {
		if hi == lo {
			scores[i].Score = 0
			continue
		}
		scores[i].Score = (scores[i].Score - lo) * MaxNodeScore / (hi - lo)
	}
}
