package nodeagent

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// fakeObjects is an objectGetter backed by maps keyed by "namespace/name".
type fakeObjects struct {
	mu         sync.Mutex
	configMaps map[string]*corev1.ConfigMap
	secrets    map[string]*corev1.Secret
	gets       int
}

func newFakeObjects() *fakeObjects {
	return &fakeObjects{configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{}}
}

func (f *fakeObjects) addConfigMap(ns, name string, data map[string]string, binary map[string][]byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.configMaps[ns+"/"+name] = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: data, BinaryData: binary}
}

func (f *fakeObjects) addSecret(ns, name string, data map[string][]byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.secrets[ns+"/"+name] = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: data}
}

func (f *fakeObjects) ConfigMap(_ context.Context, ns, name string) (*corev1.ConfigMap, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gets++
	if cm, ok := f.configMaps[ns+"/"+name]; ok {
		return cm.DeepCopy(), nil
	}
	return nil, apierrors.NewNotFound(corev1.Resource("configmaps"), name)
}

func (f *fakeObjects) RuntimeClass(_ context.Context, name string) (*nodev1.RuntimeClass, error) {
	return nil, apierrors.NewNotFound(nodev1.Resource("runtimeclasses"), name)
}

func (f *fakeObjects) Secret(_ context.Context, ns, name string) (*corev1.Secret, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gets++
	if s, ok := f.secrets[ns+"/"+name]; ok {
		return s.DeepCopy(), nil
	}
	return nil, apierrors.NewNotFound(corev1.Resource("secrets"), name)
}

func ptr[T any](v T) *T { return &v }

func testPod(vols ...corev1.Volume) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-0", UID: "uid-1",
			Labels: map[string]string{"app": "web", "tier": "front"}, Annotations: map[string]string{"note": `say "hi"`}},
		Spec: corev1.PodSpec{NodeName: "node-a", ServiceAccountName: "sa", Volumes: vols, Containers: []corev1.Container{{
			Name: "app",
			Resources: corev1.ResourceRequirements{
				Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
			},
		}}},
		Status: corev1.PodStatus{HostIP: "10.0.0.1", HostIPs: []corev1.HostIP{{IP: "10.0.0.1"}, {IP: "fd00::1"}},
			PodIP: "10.244.0.5", PodIPs: []corev1.PodIP{{IP: "10.244.0.5"}, {IP: "fd00:244::5"}}},
	}
}

// testAllocatable is the Node's allocatable that the tests' setupVolumes calls default limits to.
var testAllocatable = corev1.ResourceList{
	corev1.ResourceCPU:    resource.MustParse("3"),
	corev1.ResourceMemory: resource.MustParse("5Gi"),
}

// setupT runs setupVolumes and tears the volumes down when the test ends.
func setupT(t *testing.T, pod *corev1.Pod, podDir string, get objectGetter) (podVolumes, error) {
	t.Helper()
	t.Cleanup(func() {
		if err := teardownVolumes(podDir); err != nil {
			t.Errorf("teardownVolumes: %v", err)
		}
	})
	return setupVolumes(context.Background(), pod, podDir, get, testAllocatable, nil)
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount tmpfs")
	}
}

func readVolumeFile(t *testing.T, dir, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// visibleFiles lists the regular files reachable in a volume, as a container would see them, with modes.
func visibleFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	got := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), "..") {
			return filepath.SkipDir
		}
		if d.Type()&fs.ModeSymlink == 0 {
			return nil
		}
		rel, _ := filepath.Rel(dir, p)
		if strings.HasPrefix(rel, "..") {
			return nil
		}
		record := func(q string) error {
			info, err := os.Stat(q)
			if err != nil {
				return err
			}
			data, err := os.ReadFile(q)
			if err != nil {
				return err
			}
			r, _ := filepath.Rel(dir, filepath.Clean(q))
			got[r] = info.Mode().Perm().String() + " " + string(data)
			return nil
		}
		if info, err := os.Stat(p); err != nil || !info.IsDir() {
			return record(p)
		}
		return filepath.WalkDir(p+"/", func(q string, e fs.DirEntry, err error) error {
			if err != nil || e.IsDir() {
				return err
			}
			return record(q)
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func isTmpfs(t *testing.T, dir string) bool {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return st.Type == unix.TMPFS_MAGIC // 0x01021994
}

func TestSetupVolumesEmptyDir(t *testing.T) {
	podDir := t.TempDir()
	pod := testPod(corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptr(resource.MustParse("1Gi"))}}})
	vols, err := setupT(t, pod, podDir, newFakeObjects())
	if err != nil {
		t.Fatal(err)
	}
	dir := vols["scratch"]
	if want := filepath.Join(podDir, "volumes", "kubernetes.io~empty-dir", "scratch"); dir != want {
		t.Fatalf("path %s, want %s", dir, want)
	}
	info, err := os.Stat(dir)
	if err != nil || !info.IsDir() || info.Mode().Perm() != 0o777 {
		t.Fatalf("emptyDir %v %v", info, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "kept"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := setupVolumes(context.Background(), pod, podDir, newFakeObjects(), testAllocatable, nil); err != nil {
		t.Fatal(err)
	}
	if readVolumeFile(t, dir, "kept") != "x" {
		t.Fatal("setting up again lost the emptyDir's contents")
	}
	if err := teardownVolumes(podDir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(podDir, "volumes")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("volumes left after teardown: %v", err)
	}
	if _, err := os.Stat(podDir); err != nil {
		t.Fatalf("teardown removed the pod dir: %v", err)
	}
}

func TestSetupVolumesMemoryEmptyDirIsTmpfs(t *testing.T) {
	requireRoot(t)
	podDir := filepath.Join(t.TempDir(), "pod dir") // mountinfo escapes the space
	pod := testPod(corev1.Volume{Name: "cache", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{
		Medium: corev1.StorageMediumMemory, SizeLimit: ptr(resource.MustParse("1Mi"))}}})
	vols, err := setupT(t, pod, podDir, newFakeObjects())
	if err != nil {
		t.Fatal(err)
	}
	dir := vols["cache"]
	if !isTmpfs(t, dir) {
		t.Fatal("medium Memory emptyDir is not a tmpfs")
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	if size := int64(st.Blocks) * st.Bsize; size != 1<<20 {
		t.Errorf("tmpfs size %d, want %d", size, 1<<20)
	}
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Idempotent: no second tmpfs over the first.
	if _, err := setupVolumes(context.Background(), pod, podDir, newFakeObjects(), testAllocatable, nil); err != nil {
		t.Fatal(err)
	}
	if mounts, _ := mountPointsUnder(dir); len(mounts) != 1 {
		t.Fatalf("mounts after a second setup: %v", mounts)
	}
	if readVolumeFile(t, dir, "f") != "x" {
		t.Fatal("setting up again lost the tmpfs contents")
	}
	if err := teardownVolumes(podDir); err != nil {
		t.Fatal(err)
	}
	if mounts, _ := mountPointsUnder(podDir); len(mounts) != 0 {
		t.Fatalf("still mounted after teardown: %v", mounts)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("emptyDir left after teardown: %v", err)
	}
	if err := teardownVolumes(podDir); err != nil {
		t.Fatalf("second teardown: %v", err)
	}
}

func TestSetupVolumesConfigMap(t *testing.T) {
	objs := newFakeObjects()
	objs.addConfigMap("ns", "cfg", map[string]string{"a.conf": "alpha", "b.conf": "beta"}, map[string][]byte{"bin": {0, 1, 2}})
	tests := []struct {
		name    string
		src     corev1.ConfigMapVolumeSource
		want    map[string]string
		wantErr string
	}{
		{name: "all keys", src: corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}},
			want: map[string]string{"a.conf": "-rw-r--r-- alpha", "b.conf": "-rw-r--r-- beta", "bin": "-rw-r--r-- \x00\x01\x02"}},
		{name: "defaultMode", src: corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}, DefaultMode: ptr(int32(0o400))},
			want: map[string]string{"a.conf": "-r-------- alpha", "b.conf": "-r-------- beta", "bin": "-r-------- \x00\x01\x02"}},
		{name: "items", src: corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}, DefaultMode: ptr(int32(0o440)),
			Items: []corev1.KeyToPath{{Key: "a.conf", Path: "etc/app/a.conf", Mode: ptr(int32(0o600))}, {Key: "bin", Path: "data.bin"}}},
			want: map[string]string{"etc/app/a.conf": "-rw------- alpha", "data.bin": "-r--r----- \x00\x01\x02"}},
		{name: "optional missing", src: corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "nope"}, Optional: ptr(true)},
			want: map[string]string{}},
		{name: "optional missing item key", src: corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}, Optional: ptr(true),
			Items: []corev1.KeyToPath{{Key: "a.conf", Path: "a"}, {Key: "gone", Path: "g"}}},
			want: map[string]string{"a": "-rw-r--r-- alpha"}},
		{name: "missing", src: corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "nope"}},
			wantErr: `volume "v": configmap "nope" not found`},
		{name: "missing item key", src: corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"},
			Items: []corev1.KeyToPath{{Key: "gone", Path: "g"}}},
			wantErr: `volume "v": configmap "cfg" references non-existent config key: gone`},
		{name: "bad item path", src: corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"},
			Items: []corev1.KeyToPath{{Key: "a.conf", Path: "../escape"}}},
			wantErr: `invalid path: must not contain '..': ../escape`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			podDir := t.TempDir()
			pod := testPod(corev1.Volume{Name: "v", VolumeSource: corev1.VolumeSource{ConfigMap: &tt.src}})
			vols, err := setupT(t, pod, podDir, objs)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				if _, ok := vols["v"]; ok {
					t.Error("a failed volume is in podVolumes")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			dir := vols["v"]
			if want := filepath.Join(podDir, "volumes", "kubernetes.io~configmap", "v"); dir != want {
				t.Fatalf("path %s, want %s", dir, want)
			}
			if got := visibleFiles(t, dir); !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("files %q, want %q", got, tt.want)
			}
			for name := range tt.want {
				top, _, _ := strings.Cut(name, "/")
				if target, err := os.Readlink(filepath.Join(dir, top)); err != nil || target != "..data/"+top {
					t.Errorf("%s links to %q (%v), want ..data/%s", top, target, err, top)
				}
			}
			if target, err := os.Readlink(filepath.Join(dir, "..data")); err != nil || !strings.HasPrefix(target, "..20") {
				t.Errorf("..data -> %q (%v)", target, err)
			}
		})
	}
}

func TestSetupVolumesMissingSourceIsNotFound(t *testing.T) {
	requireRoot(t)
	pod := testPod(
		corev1.Volume{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "x"}}}},
		corev1.Volume{Name: "tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "y"}}},
		corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	)
	vols, err := setupT(t, pod, t.TempDir(), newFakeObjects())
	if !apierrors.IsNotFound(err) {
		t.Fatalf("IsNotFound(%v) is false", err)
	}
	for _, want := range []string{`volume "cfg": configmap "x" not found`, `volume "tls": secret "y" not found`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if _, ok := vols["scratch"]; !ok || len(vols) != 1 {
		t.Errorf("volumes set up beside the failures: %v", vols)
	}
}

func TestSetupVolumesSecret(t *testing.T) {
	requireRoot(t)
	objs := newFakeObjects()
	objs.addSecret("ns", "tls", map[string][]byte{"tls.key": []byte("KEY\x00\xff"), "tls.crt": []byte("CRT")})
	podDir := t.TempDir()
	pod := testPod(
		corev1.Volume{Name: "tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "tls", DefaultMode: ptr(int32(0o400))}}},
		corev1.Volume{Name: "one", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "tls",
			Items: []corev1.KeyToPath{{Key: "tls.crt", Path: "certs/server.crt", Mode: ptr(int32(0o444))}}}}},
		corev1.Volume{Name: "opt", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "absent", Optional: ptr(true)}}},
	)
	vols, err := setupT(t, pod, podDir, objs)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]map[string]string{
		"tls": {"tls.key": "-r-------- KEY\x00\xff", "tls.crt": "-r-------- CRT"},
		"one": {"certs/server.crt": "-r--r--r-- CRT"},
		"opt": {},
	} {
		dir := vols[name]
		if !strings.Contains(dir, "/kubernetes.io~secret/") {
			t.Errorf("secret volume at %s", dir)
		}
		if !isTmpfs(t, dir) {
			t.Errorf("secret volume %s is not on a tmpfs", name)
		}
		if got := visibleFiles(t, dir); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: files %q, want %q", name, got, want)
		}
	}
	if err := teardownVolumes(podDir); err != nil {
		t.Fatal(err)
	}
	if mounts, _ := mountPointsUnder(podDir); len(mounts) != 0 {
		t.Fatalf("still mounted after teardown: %v", mounts)
	}
}

func TestSetupVolumesFSGroup(t *testing.T) {
	requireRoot(t)
	objs := newFakeObjects()
	objs.addSecret("ns", "s", map[string][]byte{"k": []byte("v")})
	pod := testPod(
		corev1.Volume{Name: "s", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "s", DefaultMode: ptr(int32(0o400))}}},
		corev1.Volume{Name: "e", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	)
	pod.Spec.SecurityContext = &corev1.PodSecurityContext{FSGroup: ptr(int64(2000))}
	podDir := t.TempDir()
	vols, err := setupT(t, pod, podDir, objs)
	if err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(filepath.Join(vols["s"], "k"))
	if err != nil {
		t.Fatal(err)
	}
	if st := info.Sys().(*syscall.Stat_t); st.Gid != 2000 || info.Mode().Perm() != 0o440 {
		t.Errorf("secret file gid %d mode %v, want 2000 and 0440", st.Gid, info.Mode().Perm())
	}
	info, err = os.Stat(vols["e"])
	if err != nil {
		t.Fatal(err)
	}
	if st := info.Sys().(*syscall.Stat_t); st.Gid != 2000 || info.Mode()&fs.ModeSetgid == 0 {
		t.Errorf("emptyDir gid %d mode %v, want 2000 and setgid", st.Gid, info.Mode())
	}
	// Unchanged payload with fsGroup: nothing is rewritten.
	before, _ := os.Readlink(filepath.Join(vols["s"], "..data"))
	if _, err := setupVolumes(context.Background(), pod, podDir, objs, testAllocatable, nil); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.Readlink(filepath.Join(vols["s"], "..data")); after != before {
		t.Errorf("unchanged secret was rewritten: %s -> %s", before, after)
	}
}

func TestVolumeAtomicUpdate(t *testing.T) {
	objs := newFakeObjects()
	objs.addConfigMap("ns", "cfg", map[string]string{"keep": "1", "change": "old", "drop": "bye"}, nil)
	podDir := t.TempDir()
	pod := testPod(corev1.Volume{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
		LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}}}})
	vols, err := setupT(t, pod, podDir, objs)
	if err != nil {
		t.Fatal(err)
	}
	dir := vols["cfg"]
	first, _ := os.Readlink(filepath.Join(dir, "..data"))

	// Unchanged: nothing is written.
	if _, err := setupVolumes(context.Background(), pod, podDir, objs, testAllocatable, nil); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.Readlink(filepath.Join(dir, "..data")); again != first {
		t.Fatalf("an unchanged ConfigMap was rewritten: %s -> %s", first, again)
	}

	// A reader holding the old file keeps reading the old content while the update happens.
	old, err := os.Open(filepath.Join(dir, "change"))
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()

	objs.addConfigMap("ns", "cfg", map[string]string{"keep": "1", "change": "new", "added": "hi"}, nil)
	if _, err := setupVolumes(context.Background(), pod, podDir, objs, testAllocatable, nil); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"keep": "-rw-r--r-- 1", "change": "-rw-r--r-- new", "added": "-rw-r--r-- hi"}
	if got := visibleFiles(t, dir); !reflect.DeepEqual(got, want) {
		t.Fatalf("after update: %q, want %q", got, want)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	second, _ := os.Readlink(filepath.Join(dir, "..data"))
	wantNames := []string{second, "..data", "added", "change", "keep"}
	sort.Strings(wantNames)
	if !reflect.DeepEqual(names, wantNames) {
		t.Fatalf("volume holds %q, want %q (no stale keys or old payload)", names, wantNames)
	}
	buf := make([]byte, 8)
	n, _ := old.Read(buf)
	if string(buf[:n]) != "old" {
		t.Errorf("an open file of the old payload reads %q", buf[:n])
	}

	// The source turns optional and disappears: the volume empties.
	pod.Spec.Volumes[0].ConfigMap.Optional = ptr(true)
	delete(objs.configMaps, "ns/cfg")
	if _, err := setupVolumes(context.Background(), pod, podDir, objs, testAllocatable, nil); err != nil {
		t.Fatal(err)
	}
	if got := visibleFiles(t, dir); len(got) != 0 {
		t.Fatalf("after the optional source went: %q", got)
	}
}

func TestSetupVolumesDownwardAPI(t *testing.T) {
	podDir := t.TempDir()
	pod := testPod(corev1.Volume{Name: "info", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{
		DefaultMode: ptr(int32(0o640)),
		Items: []corev1.DownwardAPIVolumeFile{
			{Path: "labels", FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.labels"}},
			{Path: "annotations", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations"}},
			{Path: "name", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}, Mode: ptr(int32(0o444))},
			{Path: "meta/namespace", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}},
			{Path: "meta/uid", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.uid"}},
			{Path: "app", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['app']"}},
			{Path: "mem_mi", ResourceFieldRef: &corev1.ResourceFieldSelector{ContainerName: "app", Resource: "limits.memory", Divisor: resource.MustParse("1Mi")}},
			{Path: "cpu_m", ResourceFieldRef: &corev1.ResourceFieldSelector{ContainerName: "app", Resource: "requests.cpu", Divisor: resource.MustParse("1m")}},
		},
	}}})
	vols, err := setupT(t, pod, podDir, newFakeObjects())
	if err != nil {
		t.Fatal(err)
	}
	dir := vols["info"]
	want := map[string]string{
		"labels":         "-rw-r----- app=\"web\"\ntier=\"front\"",
		"annotations":    "-rw-r----- note=\"say \\\"hi\\\"\"",
		"name":           "-r--r--r-- web-0",
		"meta/namespace": "-rw-r----- ns",
		"meta/uid":       "-rw-r----- uid-1",
		"app":            "-rw-r----- web",
		"mem_mi":         "-rw-r----- 64",
		"cpu_m":          "-rw-r----- 250",
	}
	if got := visibleFiles(t, dir); !reflect.DeepEqual(got, want) {
		t.Fatalf("files %q, want %q", got, want)
	}
	pod.Labels["app"] = "api"
	if _, err := setupVolumes(context.Background(), pod, podDir, newFakeObjects(), testAllocatable, nil); err != nil {
		t.Fatal(err)
	}
	if got := readVolumeFile(t, dir, "labels"); got != "app=\"api\"\ntier=\"front\"" {
		t.Errorf("labels after relabel: %q", got)
	}

	bad := testPod(corev1.Volume{Name: "info", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{
		Items: []corev1.DownwardAPIVolumeFile{{Path: "node", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}}}}})
	if _, err := setupT(t, bad, t.TempDir(), newFakeObjects()); err == nil || !strings.Contains(err.Error(), "unsupported fieldPath: spec.nodeName") {
		t.Errorf("spec.nodeName in a downwardAPI volume: %v", err)
	}
}

func TestSetupVolumesProjected(t *testing.T) {
	requireRoot(t)
	objs := newFakeObjects()
	objs.addConfigMap("ns", "ca", map[string]string{"ca.crt": "CA"}, nil)
	objs.addSecret("ns", "tok", map[string][]byte{"token": []byte("T")})
	podDir := t.TempDir()
	pod := testPod(corev1.Volume{Name: "all", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		DefaultMode: ptr(int32(0o444)),
		Sources: []corev1.VolumeProjection{
			{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "ca"}}},
			{Secret: &corev1.SecretProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "tok"},
				Items: []corev1.KeyToPath{{Key: "token", Path: "token", Mode: ptr(int32(0o400))}}}},
			{Secret: &corev1.SecretProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "absent"}, Optional: ptr(true)}},
			{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{
				{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}}}},
		},
	}}})
	vols, err := setupT(t, pod, podDir, objs)
	if err != nil {
		t.Fatal(err)
	}
	dir := vols["all"]
	if !isTmpfs(t, dir) {
		t.Error("projected volume is not on a tmpfs")
	}
	want := map[string]string{"ca.crt": "-r--r--r-- CA", "token": "-r-------- T", "namespace": "-r--r--r-- ns"}
	if got := visibleFiles(t, dir); !reflect.DeepEqual(got, want) {
		t.Fatalf("files %q, want %q", got, want)
	}
}

func TestSetupVolumesUnsupported(t *testing.T) {
	tests := []struct {
		name    string
		src     corev1.VolumeSource
		wantErr string
	}{
		{"csi", corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{Driver: "example.com/disk"}},
			`spec.volumes[2]: csi volume "c": driver name example.com/disk not found in the list of registered CSI drivers (this node runs no CSI drivers)`},
		{"image, on a node without a container runtime", corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: "busybox"}},
			"spec.volumes[2]: image volumes are not supported by this node"},
		{"nfs", corev1.VolumeSource{NFS: &corev1.NFSVolumeSource{Server: "s", Path: "/"}},
			"spec.volumes[2]: nfs volumes are not supported by this node"},
		{"hugepages", corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumHugePages}},
			`spec.volumes[2].emptyDir.medium: "HugePages" is not supported by this node`},
		{"trust bundle", corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
			{ClusterTrustBundle: &corev1.ClusterTrustBundleProjection{Path: "b"}}}}},
			"spec.volumes[2].projected.sources[0]: clusterTrustBundle projections are not supported by this node"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			podDir := t.TempDir()
			pod := testPod(
				corev1.Volume{Name: "a", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				corev1.Volume{Name: "b", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				corev1.Volume{Name: "c", VolumeSource: tt.src},
			)
			_, err := setupT(t, pod, podDir, newFakeObjects())
			if err == nil || err.Error() != tt.wantErr {
				t.Fatalf("error %v, want %q", err, tt.wantErr)
			}
			if !errors.Is(err, errNotSupported) {
				t.Errorf("errors.Is(%v, errNotSupported) is false", err)
			}
			if _, err := os.Stat(filepath.Join(podDir, "volumes")); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("an unsupported pod had volumes made: %v", err)
			}
		})
	}
}

func TestHostPathVolume(t *testing.T) {
	host := t.TempDir()
	dir := filepath.Join(host, "dir")
	file := filepath.Join(host, "file")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(host, "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	block := filepath.Join(host, "blk")
	haveBlock := unix.Mknod(block, unix.S_IFBLK|0o600, int(unix.Mkdev(7, 0))) == nil

	tests := []struct {
		name    string
		path    string
		typ     corev1.HostPathType
		wantErr string
		check   func(t *testing.T)
	}{
		{name: "unset missing", path: filepath.Join(host, "missing"), typ: corev1.HostPathUnset},
		{name: "directory", path: dir, typ: corev1.HostPathDirectory},
		{name: "directory is file", path: file, typ: corev1.HostPathDirectory, wantErr: "hostPath type check failed: " + file + " is not a directory"},
		{name: "directory missing", path: filepath.Join(host, "nodir"), typ: corev1.HostPathDirectory, wantErr: " is not a directory"},
		{name: "directory or create", path: filepath.Join(host, "new/sub"), typ: corev1.HostPathDirectoryOrCreate, check: func(t *testing.T) {
			if info, err := os.Stat(filepath.Join(host, "new/sub")); err != nil || !info.IsDir() || info.Mode().Perm() != 0o755 {
				t.Errorf("DirectoryOrCreate made %v %v", info, err)
			}
		}},
		{name: "directory or create on file", path: file, typ: corev1.HostPathDirectoryOrCreate, wantErr: " is not a directory"},
		{name: "file", path: file, typ: corev1.HostPathFile},
		{name: "file is dir", path: dir, typ: corev1.HostPathFile, wantErr: "hostPath type check failed: " + dir + " is not a file"},
		{name: "file or create", path: filepath.Join(host, "newfile"), typ: corev1.HostPathFileOrCreate, check: func(t *testing.T) {
			if info, err := os.Stat(filepath.Join(host, "newfile")); err != nil || !info.Mode().IsRegular() {
				t.Errorf("FileOrCreate made %v %v", info, err)
			}
		}},
		{name: "file or create on dir", path: dir, typ: corev1.HostPathFileOrCreate, wantErr: " is not a file"},
		{name: "socket", path: sock, typ: corev1.HostPathSocket},
		{name: "socket is file", path: file, typ: corev1.HostPathSocket, wantErr: " is not a socket file"},
		{name: "char device", path: "/dev/null", typ: corev1.HostPathCharDev},
		{name: "char device is dir", path: dir, typ: corev1.HostPathCharDev, wantErr: " is not a character device"},
		{name: "block device is char device", path: "/dev/null", typ: corev1.HostPathBlockDev, wantErr: "/dev/null is not a block device"},
		{name: "invalid type", path: dir, typ: "Bogus", wantErr: "spec.volumes[0].hostPath.type: Bogus is an invalid volume type"},
		{name: "relative", path: "rel/path", wantErr: `spec.volumes[0].hostPath.path: "rel/path" is not an absolute path`},
	}
	if haveBlock {
		tests = append(tests, struct {
			name    string
			path    string
			typ     corev1.HostPathType
			wantErr string
			check   func(t *testing.T)
		}{name: "block device", path: block, typ: corev1.HostPathBlockDev})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := testPod(corev1.Volume{Name: "h", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: tt.path, Type: ptr(tt.typ)}}})
			vols, err := setupT(t, pod, t.TempDir(), newFakeObjects())
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if vols["h"] != tt.path {
				t.Errorf("path %s, want %s", vols["h"], tt.path)
			}
			if tt.check != nil {
				tt.check(t)
			}
		})
	}
	// Teardown leaves the host's paths alone.
	podDir := t.TempDir()
	pod := testPod(corev1.Volume{Name: "h", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir}}})
	if _, err := setupVolumes(context.Background(), pod, podDir, newFakeObjects(), testAllocatable, nil); err != nil {
		t.Fatal(err)
	}
	if err := teardownVolumes(podDir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("teardown touched the hostPath: %v", err)
	}
}

func TestContainerMounts(t *testing.T) {
	podDir := t.TempDir()
	objs := newFakeObjects()
	objs.addConfigMap("ns", "cfg", map[string]string{"app.conf": "x"}, nil)
	host := t.TempDir()
	hostFile := filepath.Join(host, "f")
	if err := os.WriteFile(hostFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	pod := testPod(
		corev1.Volume{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		corev1.Volume{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}}}},
		corev1.Volume{Name: "hostfile", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: hostFile, Type: ptr(corev1.HostPathFile)}}},
	)
	vols, err := setupT(t, pod, podDir, objs)
	if err != nil {
		t.Fatal(err)
	}
	data, cfg := vols["data"], vols["cfg"]
	if err := os.Symlink("/etc", filepath.Join(data, "escape")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("logs", filepath.Join(data, "inside")); err != nil {
		t.Fatal(err)
	}
	env := []string{"POD_NAME=web-0", "EMPTY=", "POD_NAME=web-1"}

	tests := []struct {
		name    string
		mounts  []corev1.VolumeMount
		want    []specs.Mount
		wantErr string
		check   func(t *testing.T)
	}{
		{name: "plain and sorted by depth", mounts: []corev1.VolumeMount{
			{Name: "data", MountPath: "/var/lib/app/cache"},
			{Name: "data", MountPath: "/var/lib", ReadOnly: true},
			{Name: "cfg", MountPath: "/etc/app"},
			{Name: "hostfile", MountPath: "/etc/f", MountPropagation: ptr(corev1.MountPropagationHostToContainer)},
			{Name: "data", MountPath: "/shared", MountPropagation: ptr(corev1.MountPropagationBidirectional), BindMountOptions: []string{"nosuid", "nodev"}},
		}, want: []specs.Mount{
			{Destination: "/shared", Type: "bind", Source: data, Options: []string{"rbind", "rshared", "rw", "nosuid", "nodev"}},
			{Destination: "/var/lib", Type: "bind", Source: data, Options: []string{"rbind", "rprivate", "ro"}},
			{Destination: "/etc/app", Type: "bind", Source: cfg, Options: []string{"rbind", "rprivate", "ro"}},
			{Destination: "/etc/f", Type: "bind", Source: hostFile, Options: []string{"rbind", "rslave", "rw"}},
			{Destination: "/var/lib/app/cache", Type: "bind", Source: data, Options: []string{"rbind", "rprivate", "rw"}},
		}},
		{name: "recursive read-only", mounts: []corev1.VolumeMount{{Name: "data", MountPath: "/d", ReadOnly: true, RecursiveReadOnly: ptr(corev1.RecursiveReadOnlyEnabled)}},
			want: []specs.Mount{{Destination: "/d", Type: "bind", Source: data, Options: []string{"rbind", "rprivate", "rro"}}}},
		{name: "subPath created", mounts: []corev1.VolumeMount{{Name: "data", MountPath: "/logs", SubPath: "logs/app"}},
			want: []specs.Mount{{Destination: "/logs", Type: "bind", Source: filepath.Join(data, "logs/app"), Options: []string{"rbind", "rprivate", "rw"}}},
			check: func(t *testing.T) {
				info, err := os.Stat(filepath.Join(data, "logs/app"))
				if err != nil || !info.IsDir() || info.Mode().Perm() != 0o777 {
					t.Errorf("subPath dir %v %v, want a 0777 directory", info, err)
				}
			}},
		{name: "subPath through an inside symlink", mounts: []corev1.VolumeMount{{Name: "data", MountPath: "/l", SubPath: "inside/app"}},
			want: []specs.Mount{{Destination: "/l", Type: "bind", Source: filepath.Join(data, "logs/app"), Options: []string{"rbind", "rprivate", "rw"}}}},
		{name: "subPath of a configMap key", mounts: []corev1.VolumeMount{{Name: "cfg", MountPath: "/etc/app.conf", SubPath: "app.conf"}},
			check: func(t *testing.T) {}},
		{name: "subPathExpr", mounts: []corev1.VolumeMount{{Name: "data", MountPath: "/out", SubPathExpr: "pods/$(POD_NAME)"}},
			want: []specs.Mount{{Destination: "/out", Type: "bind", Source: filepath.Join(data, "pods/web-1"), Options: []string{"rbind", "rprivate", "rw"}}}},
		{name: "subPathExpr missing var", mounts: []corev1.VolumeMount{{Name: "data", MountPath: "/out", SubPathExpr: "$(NOPE)/$(EMPTY)"}},
			wantErr: `container "app": volumeMount "data": subPathExpr "$(NOPE)/$(EMPTY)": missing value for EMPTY, NOPE`},
		{name: "subPath dotdot", mounts: []corev1.VolumeMount{{Name: "data", MountPath: "/x", SubPath: "a/../../etc"}},
			wantErr: `container "app": volumeMount "data": subPath "a/../../etc" must not contain '..'`},
		{name: "subPathExpr to dotdot", mounts: []corev1.VolumeMount{{Name: "data", MountPath: "/x", SubPathExpr: "$(UP)/etc"}},
			wantErr: `subPath "../etc" must not contain '..'`},
		{name: "subPath absolute", mounts: []corev1.VolumeMount{{Name: "data", MountPath: "/x", SubPath: "/etc"}},
			wantErr: `subPath "/etc" must not be an absolute path`},
		{name: "subPath symlink out", mounts: []corev1.VolumeMount{{Name: "data", MountPath: "/x", SubPath: "escape/passwd"}},
			wantErr: `escape leads out of the volume`},
		{name: "unknown volume", mounts: []corev1.VolumeMount{{Name: "nope", MountPath: "/x"}},
			wantErr: `cannot find volume "nope" to mount into container "app"`},
		{name: "bad bind option", mounts: []corev1.VolumeMount{{Name: "data", MountPath: "/x", BindMountOptions: []string{"suid"}}},
			wantErr: `bindMountOptions: "suid" is not one of noexec, nodev, nosuid`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &corev1.Container{Name: "app", VolumeMounts: tt.mounts}
			got, err := containerMounts(c, vols, append(env, "UP=.."))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tt.want != nil && !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("mounts\n%+v\nwant\n%+v", got, tt.want)
			}
			if tt.check != nil {
				tt.check(t)
			}
		})
	}

	// A subPath of a configMap key is the file of the current payload, read-only.
	got, err := containerMounts(&corev1.Container{Name: "app", VolumeMounts: []corev1.VolumeMount{{Name: "cfg", MountPath: "/etc/app.conf", SubPath: "app.conf"}}}, vols, nil)
	if err != nil {
		t.Fatal(err)
	}
	ts, _ := os.Readlink(filepath.Join(cfg, "..data"))
	if want := filepath.Join(cfg, ts, "app.conf"); got[0].Source != want || got[0].Options[2] != "ro" {
		t.Errorf("configMap subPath mount %+v, want source %s read-only", got[0], want)
	}
}

func TestMountinfoUnescape(t *testing.T) {
	for in, want := range map[string]string{
		"/plain": "/plain", `/a\040b`: "/a b", `/tab\011x\134y`: "/tab\tx\\y", `/short\04`: `/short\04`, `/bad\09x`: `/bad\09x`,
	} {
		if got := unescapeMountinfo(in); got != want {
			t.Errorf("unescapeMountinfo(%q) = %q, want %q", in, got, want)
		}
	}
}
