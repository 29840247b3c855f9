package nodeagent

import (
	"context"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// conformanceDownwardPod is the pod of the e2e "[sig-storage] Downward API volume" and "Projected
// downwardAPI" tests (downwardAPIVolumeBasePod): a container without resources, whose volume nonetheless
// holds its cpu and memory limits and requests beside the pod's name, labels and annotations.
func conformanceDownwardPod(projected bool, defaultMode, itemMode *int32) *corev1.Pod {
	items := []corev1.DownwardAPIVolumeFile{
		{Path: "podname", FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"}, Mode: itemMode},
		{Path: "cpu_limit", ResourceFieldRef: &corev1.ResourceFieldSelector{ContainerName: "client-container", Resource: "limits.cpu"}},
		{Path: "cpu_request", ResourceFieldRef: &corev1.ResourceFieldSelector{ContainerName: "client-container", Resource: "requests.cpu"}},
		{Path: "memory_limit", ResourceFieldRef: &corev1.ResourceFieldSelector{ContainerName: "client-container", Resource: "limits.memory"}},
		{Path: "memory_request", ResourceFieldRef: &corev1.ResourceFieldSelector{ContainerName: "client-container", Resource: "requests.memory"}},
		{Path: "labels", FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.labels"}},
		{Path: "annotations", FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.annotations"}},
	}
	src := corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: items, DefaultMode: defaultMode}}
	if projected {
		src = corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{DefaultMode: defaultMode,
			Sources: []corev1.VolumeProjection{{DownwardAPI: &corev1.DownwardAPIProjection{Items: items}}}}}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "downwardapi-volume-1", UID: "uid-1",
			Labels: map[string]string{"key1": "value1", "key2": "value2"}, Annotations: map[string]string{"builder": "bar"}},
		Spec: corev1.PodSpec{NodeName: "node-a", RestartPolicy: corev1.RestartPolicyNever,
			Volumes:    []corev1.Volume{{Name: "podinfo", VolumeSource: src}},
			Containers: []corev1.Container{{Name: "client-container", VolumeMounts: []corev1.VolumeMount{{Name: "podinfo", MountPath: "/etc/podinfo"}}}}},
	}
}

// TestDownwardAPIVolumeConformance writes the conformance tests' downward API volumes: a container without
// requests reads them as 0 and its limits as the Node's allocatable (testAllocatable, as the runtime passes
// the Node status's), files are 0644 unless defaultMode or the item's mode says otherwise, and a sync after the
// pod's labels or annotations changed rewrites them.
func TestDownwardAPIVolumeConformance(t *testing.T) {
	requireRoot(t) // projected volumes are tmpfs mounts
	cases := []struct {
		name                       string
		projected                  bool
		defaultMode, itemMode      *int32
		podnameMode, otherFileMode string
	}{
		{name: "downwardAPI", podnameMode: "-rw-r--r--", otherFileMode: "-rw-r--r--"},
		{name: "downwardAPI defaultMode", defaultMode: ptr(int32(0o400)), podnameMode: "-r--------", otherFileMode: "-r--------"},
		{name: "downwardAPI item mode", itemMode: ptr(int32(0o400)), podnameMode: "-r--------", otherFileMode: "-rw-r--r--"},
		{name: "projected", projected: true, podnameMode: "-rw-r--r--", otherFileMode: "-rw-r--r--"},
		{name: "projected defaultMode", projected: true, defaultMode: ptr(int32(0o400)), podnameMode: "-r--------", otherFileMode: "-r--------"},
		{name: "projected item mode", projected: true, itemMode: ptr(int32(0o400)), podnameMode: "-r--------", otherFileMode: "-rw-r--r--"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod := conformanceDownwardPod(tc.projected, tc.defaultMode, tc.itemMode)
			podDir := t.TempDir()
			vols, err := setupT(t, pod, podDir, newFakeObjects())
			if err != nil {
				t.Fatal(err)
			}
			dir := vols["podinfo"]
			m := tc.otherFileMode + " "
			want := map[string]string{
				"podname":        tc.podnameMode + " downwardapi-volume-1",
				"cpu_limit":      m + "3",
				"cpu_request":    m + "0",
				"memory_limit":   m + "5368709120",
				"memory_request": m + "0",
				"labels":         m + "key1=\"value1\"\nkey2=\"value2\"",
				"annotations":    m + "builder=\"bar\"",
			}
			if got := visibleFiles(t, dir); !reflect.DeepEqual(got, want) {
				t.Fatalf("files %q, want %q", got, want)
			}

			// The pod as the informer has it after `kubectl label` and `kubectl annotate`: the next sync
			// rewrites the files.
			pod = pod.DeepCopy()
			pod.Labels["key3"] = "value3"
			pod.Annotations["builder"] = "foo"
			if _, err := setupVolumes(context.Background(), pod, podDir, newFakeObjects(), testAllocatable, nil); err != nil {
				t.Fatal(err)
			}
			if got := readVolumeFile(t, dir, "labels"); got != "key1=\"value1\"\nkey2=\"value2\"\nkey3=\"value3\"" {
				t.Errorf("labels after the update: %q", got)
			}
			if got := readVolumeFile(t, dir, "annotations"); got != "builder=\"foo\"" {
				t.Errorf("annotations after the update: %q", got)
			}
		})
	}
}
