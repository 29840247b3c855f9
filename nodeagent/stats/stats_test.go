package stats

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// writeTree writes files (path relative to root: content) under root.
func writeTree(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for path, content := range files {
		full := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// procStat has busy ticks user 100 + nice 20 + system 30 + irq 4 + softirq 5 + steal 1 = 160 (1.6 s); idle,
// iowait and guest are left out.
const procStat = "cpu  100 20 30 9000 50 4 5 1 7 0\ncpu0 100 20 30 9000 50 4 5 1 7 0\nintr 1\n"

const meminfo = `MemTotal:       16000 kB
MemFree:         4000 kB
MemAvailable:   10000 kB
Inactive(file):  3000 kB
`

func fakeTree(t *testing.T, v2 bool) *Reader {
	root := t.TempDir()
	files := map[string]string{"proc/stat": procStat, "proc/meminfo": meminfo}
	if v2 {
		files["cgroup/skiff/c1/cpu.stat"] = "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n"
		files["cgroup/skiff/c1/memory.current"] = "10485760\n"
		files["cgroup/skiff/c1/memory.stat"] = "anon 8388608\nfile 2097152\nactive_file 1048576\ninactive_file 1048576\n"
		files["cgroup/memory.stat"] = "anon 1\ninactive_file 2048000\n"
	} else {
		files["cgroup/cpuacct/skiff/c1/cpuacct.usage"] = "2500000000\n"
		files["cgroup/memory/skiff/c1/memory.usage_in_bytes"] = "10485760\n"
		files["cgroup/memory/skiff/c1/memory.stat"] = "cache 2097152\ninactive_file 1\ntotal_cache 2097152\ntotal_inactive_file 1048576\n"
		files["cgroup/memory/memory.usage_in_bytes"] = "8000000000\n"
		files["cgroup/memory/memory.stat"] = "total_inactive_file 3000000000\n"
	}
	writeTree(t, root, files)
	return &Reader{CgroupRoot: filepath.Join(root, "cgroup"), ProcRoot: filepath.Join(root, "proc"), Parent: "skiff", V2: v2,
		now: func() time.Time { return time.UnixMilli(1_700_000_000_123) }}
}

func TestReader(t *testing.T) {
	cases := []struct {
		name     string
		v2       bool
		nodeMem  uint64
		nodeNote string
	}{
		{"cgroup v1", false, 5_000_000_000, "root memory cgroup usage less total_inactive_file"},
		{"cgroup v2", true, (16000-4000)*1024 - 2048000, "MemTotal-MemFree less the root memory.stat inactive_file"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := fakeTree(t, tc.v2)
			c, err := r.Container("c1")
			if err != nil {
				t.Fatal(err)
			}
			if c.CPUNanoseconds != 2_500_000_000 || c.WorkingSetBytes != 10485760-1048576 {
				t.Errorf("container usage %+v, want 2.5 s and 9 MiB", c)
			}
			if _, err := r.Container("gone"); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("a container without a cgroup: %v, want ErrNotExist", err)
			}
			if _, err := r.Container("../c1"); err == nil {
				t.Error("a container ID with a slash was read")
			}
			n, err := r.Node()
			if err != nil {
				t.Fatal(err)
			}
			if n.CPUNanoseconds != 1_600_000_000 {
				t.Errorf("node CPU %d ns, want 1.6 s", n.CPUNanoseconds)
			}
			if n.WorkingSetBytes != tc.nodeMem {
				t.Errorf("node working set %d, want %d (%s)", n.WorkingSetBytes, tc.nodeMem, tc.nodeNote)
			}
		})
	}
}

// TestNodeMemoryV2WithoutRootStat: kernels without a root memory.stat fall back to meminfo's Inactive(file).
func TestNodeMemoryV2WithoutRootStat(t *testing.T) {
	r := fakeTree(t, true)
	os.Remove(filepath.Join(r.CgroupRoot, "memory.stat"))
	n, err := r.Node()
	if err != nil {
		t.Fatal(err)
	}
	if want := uint64((16000 - 4000 - 3000) * 1024); n.WorkingSetBytes != want {
		t.Fatalf("node working set %d, want %d", n.WorkingSetBytes, want)
	}
}

// TestHandler scrapes the endpoint and parses it back: node, container and pod series with timestamps, the
// sandbox counted for its pod only, an exited container left out without an error.
func TestHandler(t *testing.T) {
	r := fakeTree(t, false)
	writeTree(t, filepath.Dir(r.CgroupRoot), map[string]string{
		"cgroup/cpuacct/skiff/pause1/cpuacct.usage":        "500000000\n",
		"cgroup/memory/skiff/pause1/memory.usage_in_bytes": "1048576\n",
		"cgroup/memory/skiff/pause1/memory.stat":           "total_inactive_file 0\n",
	})
	start := time.Unix(1_699_999_000, 500_000_000)
	containers := []Container{
		{Namespace: "default", Pod: "web", PodUID: "u1", ID: "pause1"},
		{Namespace: "default", Pod: "web", PodUID: "u1", Name: "nginx", ID: "c1", StartTime: start},
		{Namespace: "default", Pod: "web", PodUID: "u1", Name: "exited", ID: "gone", StartTime: start},
	}
	srv := httptest.NewServer(Handler(r, func() []Container { return containers }))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics/resource")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); expfmt.ResponseFormat(resp.Header).FormatType() != expfmt.TypeTextPlain {
		t.Fatalf("Content-Type %q", ct)
	}
	body, _ := io.ReadAll(resp.Body)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parsing:\n%s\n%v", body, err)
	}
	const ts = 1_700_000_000_123
	want := []struct {
		family string
		labels map[string]string
		value  float64
		ts     int64 // 0: no timestamp
	}{
		{"node_cpu_usage_seconds_total", nil, 1.6, ts},
		{"node_memory_working_set_bytes", nil, 5e9, ts},
		{"container_cpu_usage_seconds_total", map[string]string{"container": "nginx", "namespace": "default", "pod": "web"}, 2.5, ts},
		{"container_memory_working_set_bytes", map[string]string{"container": "nginx", "namespace": "default", "pod": "web"}, 9 << 20, ts},
		{"container_start_time_seconds", map[string]string{"container": "nginx", "namespace": "default", "pod": "web"}, 1_699_999_000.5, 0},
		{"pod_cpu_usage_seconds_total", map[string]string{"namespace": "default", "pod": "web"}, 3, ts},
		{"pod_memory_working_set_bytes", map[string]string{"namespace": "default", "pod": "web"}, 10 << 20, ts},
		{"resource_scrape_error", nil, 0, 0},
		{"scrape_error", nil, 0, 0},
	}
	if len(families) != len(want) {
		t.Errorf("%d families, want %d:\n%s", len(families), len(want), body)
	}
	for _, w := range want {
		mf := families[w.family]
		if mf == nil || len(mf.Metric) != 1 {
			t.Errorf("%s: want one sample:\n%s", w.family, body)
			continue
		}
		m := mf.Metric[0]
		got := map[string]string{}
		for _, l := range m.Label {
			got[l.GetName()] = l.GetValue()
		}
		if len(got) != len(w.labels) {
			t.Errorf("%s: labels %v, want %v", w.family, got, w.labels)
		}
		for k, v := range w.labels {
			if got[k] != v {
				t.Errorf("%s: labels %v, want %v", w.family, got, w.labels)
			}
		}
		if v := value(m); v != w.value {
			t.Errorf("%s = %v, want %v", w.family, v, w.value)
		}
		if m.GetTimestampMs() != w.ts {
			t.Errorf("%s: timestamp %d, want %d", w.family, m.GetTimestampMs(), w.ts)
		}
	}
}

// TestHandlerReadError: an unreadable figure is left out and flagged with resource_scrape_error 1.
func TestHandlerReadError(t *testing.T) {
	r := fakeTree(t, true)
	os.WriteFile(filepath.Join(r.CgroupRoot, "skiff/c1/memory.current"), []byte("garbage\n"), 0o644)
	families := map[string]*dto.MetricFamily{}
	for _, mf := range collect(r, []Container{{Namespace: "ns", Pod: "p", Name: "c", ID: "c1"}}) {
		families[mf.GetName()] = mf
	}
	if v := value(families["resource_scrape_error"].Metric[0]); v != 1 {
		t.Errorf("resource_scrape_error = %v, want 1", v)
	}
	if families["container_cpu_usage_seconds_total"] != nil {
		t.Error("the unreadable container has a series")
	}
	if families["node_cpu_usage_seconds_total"] == nil {
		t.Error("the node's series are missing")
	}
}

func value(m *dto.Metric) float64 {
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}
