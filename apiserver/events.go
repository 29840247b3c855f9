package apiserver

import (
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/conversion"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
)

// events.k8s.io/v1 Events are the same objects as core v1 Events, in another shape: they share the storage
// (core v1 protobuf under /registry/events), and the scheme converts between the two as kube-apiserver
// does.

func init() {
	utilruntime.Must(Scheme.AddConversionFunc((*eventsv1.Event)(nil), (*corev1.Event)(nil), func(a, b interface{}, _ conversion.Scope) error {
		in, out := a.(*eventsv1.Event), b.(*corev1.Event)
		*out = corev1.Event{
			TypeMeta: out.TypeMeta, ObjectMeta: in.ObjectMeta, InvolvedObject: in.Regarding, Reason: in.Reason,
			Message: in.Note, FirstTimestamp: in.DeprecatedFirstTimestamp, LastTimestamp: in.DeprecatedLastTimestamp,
			Count: in.DeprecatedCount, Type: in.Type, EventTime: in.EventTime, Action: in.Action, Related: in.Related,
			ReportingController: in.ReportingController, ReportingInstance: in.ReportingInstance,
			Source: corev1.EventSource{Component: in.DeprecatedSource.Component, Host: in.DeprecatedSource.Host},
		}
		if in.Series != nil {
			out.Series = &corev1.EventSeries{Count: in.Series.Count, LastObservedTime: in.Series.LastObservedTime}
		}
		return nil
	}))
	utilruntime.Must(Scheme.AddConversionFunc((*corev1.Event)(nil), (*eventsv1.Event)(nil), func(a, b interface{}, _ conversion.Scope) error {
		in, out := a.(*corev1.Event), b.(*eventsv1.Event)
		*out = eventsv1.Event{
			TypeMeta: out.TypeMeta, ObjectMeta: in.ObjectMeta, Regarding: in.InvolvedObject, Reason: in.Reason,
			Note: in.Message, DeprecatedFirstTimestamp: in.FirstTimestamp, DeprecatedLastTimestamp: in.LastTimestamp,
			DeprecatedCount: in.Count, Type: in.Type, EventTime: in.EventTime, Action: in.Action, Related: in.Related,
			ReportingController: in.ReportingController, ReportingInstance: in.ReportingInstance,
			DeprecatedSource: corev1.EventSource{Component: in.Source.Component, Host: in.Source.Host},
		}
		if in.Series != nil {
			out.Series = &eventsv1.EventSeries{Count: in.Series.Count, LastObservedTime: in.Series.LastObservedTime}
		}
		return nil
	}))
}
