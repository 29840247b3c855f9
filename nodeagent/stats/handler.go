package stats

import (
	"bytes"
	"cmp"
	"errors"
	"net/http"
	"os"
	"slices"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// Container is one container of a pod on the node, as the agent knows it.
type Container struct {
	Namespace, Pod string
	// PodUID tells apart two pods of one name while the old one is still being torn down.
	PodUID string
	// Name is the container's name in the pod spec; empty for the pod's sandbox ("pause") container, which
	// counts towards the pod's figures but has no series of its own, as with the kubelet.
	Name string
	// ID is the containerd container ID, which names its cgroup.
	ID string
	// StartTime is when the container started; zero when unknown.
	StartTime time.Time
}

// Metric families of the endpoint, named and described as the kubelet's (the "[STABLE]" prefix is how the
// kubelet's metrics framework marks their stability in HELP).
var (
	nodeCPU        = family{"node_cpu_usage_seconds_total", "[STABLE] Cumulative cpu time consumed by the node in core-seconds", dto.MetricType_COUNTER}
	nodeMemory     = family{"node_memory_working_set_bytes", "[STABLE] Current working set of the node in bytes", dto.MetricType_GAUGE}
	containerCPU   = family{"container_cpu_usage_seconds_total", "[STABLE] Cumulative cpu time consumed by the container in core-seconds", dto.MetricType_COUNTER}
	containerMem   = family{"container_memory_working_set_bytes", "[STABLE] Current working set of the container in bytes", dto.MetricType_GAUGE}
	containerStart = family{"container_start_time_seconds", "[STABLE] Start time of the container since unix epoch in seconds", dto.MetricType_GAUGE}
	podCPU         = family{"pod_cpu_usage_seconds_total", "[STABLE] Cumulative cpu time consumed by the pod in core-seconds", dto.MetricType_COUNTER}
	podMemory      = family{"pod_memory_working_set_bytes", "[STABLE] Current working set of the pod in bytes", dto.MetricType_GAUGE}
	scrapeError    = family{"resource_scrape_error", "[STABLE] 1 if there was an error while getting container metrics, 0 otherwise", dto.MetricType_GAUGE}
	// scrapeErrorOld is the name the kubelet used before 1.29; kept for scrapers that still look for it.
	scrapeErrorOld = family{"scrape_error", "[ALPHA] (Deprecated since 1.29.0) 1 if there was an error while getting container metrics, 0 otherwise", dto.MetricType_GAUGE}
)

type family struct {
	name, help string
	typ        dto.MetricType
}

// Handler serves the kubelet's resource metrics endpoint (mounted at /metrics/resource) in the Prometheus
// text format: cumulative CPU seconds and memory working sets of the node, of each container listed, and of
// each pod (the sum of its containers, its sandbox included). Usage samples carry the time they were read,
// in milliseconds, for scrapers to compute rates from; container_start_time_seconds and the scrape error
// carry none, as the kubelet's.
//
// A container whose cgroup is gone has exited since list ran and is left out quietly; any other failure
// to read leaves the figure out and sets resource_scrape_error to 1.
func Handler(r *Reader, list func() []Container) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodGet && req.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		var buf bytes.Buffer
		for _, mf := range collect(r, list()) {
			if _, err := expfmt.MetricFamilyToText(&buf, mf); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		}
		w.Header().Set("Content-Type", string(expfmt.FmtText))
		w.Write(buf.Bytes())
	})
}

// podKey identifies a pod's series.
type podKey struct{ namespace, name string }

// reading is one container's usage.
type reading struct {
	c Container
	u Usage
}

// collect reads the node and the containers and returns the metric families, sorted by name as the
// kubelet's registry writes them.
func collect(r *Reader, containers []Container) []*dto.MetricFamily {
	out := map[family][]*dto.Metric{}
	failed := false
	add := func(f family, value float64, t time.Time, labels ...string) {
		m := &dto.Metric{}
		for i := 0; i+1 < len(labels); i += 2 {
			m.Label = append(m.Label, &dto.LabelPair{Name: ptr(labels[i]), Value: ptr(labels[i+1])})
		}
		if f.typ == dto.MetricType_COUNTER {
			m.Counter = &dto.Counter{Value: ptr(value)}
		} else {
			m.Gauge = &dto.Gauge{Value: ptr(value)}
		}
		if !t.IsZero() {
			m.TimestampMs = ptr(t.UnixMilli())
		}
		out[f] = append(out[f], m)
	}

	if u, err := r.Node(); err != nil {
		failed = true
	} else {
		add(nodeCPU, seconds(u.CPUNanoseconds), u.Time)
		add(nodeMemory, float64(u.WorkingSetBytes), u.Time)
	}

	// Read every container, grouped by pod incarnation (UID).
	byUID := map[string][]reading{}
	var uids []string
	for _, c := range containers {
		u, err := r.Container(c.ID)
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				failed = true
			}
			continue
		}
		uid := c.PodUID
		if uid == "" {
			uid = c.Namespace + "/" + c.Pod
		}
		if _, ok := byUID[uid]; !ok {
			uids = append(uids, uid)
		}
		byUID[uid] = append(byUID[uid], reading{c, u})
	}
	// Series are keyed by namespace and name, so of two incarnations of a pod only the one started last is
	// written; two series of one name would make the whole exposition invalid.
	pods := map[podKey][]reading{}
	for _, uid := range uids {
		rs := byUID[uid]
		key := podKey{rs[0].c.Namespace, rs[0].c.Pod}
		if old, ok := pods[key]; !ok || latestStart(rs).After(latestStart(old)) {
			pods[key] = rs
		}
	}
	for key, rs := range pods {
		var cpu, mem uint64
		var at time.Time
		for _, rd := range rs {
			cpu += rd.u.CPUNanoseconds
			mem += rd.u.WorkingSetBytes
			if rd.u.Time.After(at) {
				at = rd.u.Time
			}
			if rd.c.Name == "" {
				continue // the sandbox
			}
			labels := []string{"container", rd.c.Name, "namespace", key.namespace, "pod", key.name}
			add(containerCPU, seconds(rd.u.CPUNanoseconds), rd.u.Time, labels...)
			add(containerMem, float64(rd.u.WorkingSetBytes), rd.u.Time, labels...)
			if rd.c.StartTime.Unix() > 0 {
				add(containerStart, float64(rd.c.StartTime.UnixNano())/float64(time.Second), time.Time{}, labels...)
			}
		}
		add(podCPU, seconds(cpu), at, "namespace", key.namespace, "pod", key.name)
		add(podMemory, float64(mem), at, "namespace", key.namespace, "pod", key.name)
	}
	errValue := 0.0
	if failed {
		errValue = 1
	}
	add(scrapeError, errValue, time.Time{})
	add(scrapeErrorOld, errValue, time.Time{})

	families := make([]*dto.MetricFamily, 0, len(out))
	for f, ms := range out {
		slices.SortFunc(ms, compareLabels)
		families = append(families, &dto.MetricFamily{Name: ptr(f.name), Help: ptr(f.help), Type: ptr(f.typ), Metric: ms})
	}
	slices.SortFunc(families, func(a, b *dto.MetricFamily) int { return cmp.Compare(a.GetName(), b.GetName()) })
	return families
}

func latestStart(rs []reading) time.Time {
	var t time.Time
	for _, rd := range rs {
		if rd.c.StartTime.After(t) {
			t = rd.c.StartTime
		}
	}
	return t
}

// compareLabels orders a family's samples by their label values, as the Prometheus registry does.
func compareLabels(a, b *dto.Metric) int {
	for i := range min(len(a.Label), len(b.Label)) {
		if c := cmp.Compare(a.Label[i].GetValue(), b.Label[i].GetValue()); c != 0 {
			return c
		}
	}
	return cmp.Compare(len(a.Label), len(b.Label))
}

func seconds(ns uint64) float64 { return float64(ns) / float64(time.Second) }

func ptr[T any](v T) *T { return &v }
