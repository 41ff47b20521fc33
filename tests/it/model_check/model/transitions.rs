//! The transitions: what each action does to the state

use super::*;

impl ProtocolModel {
    pub fn new(config: Config) -> Self {
        ProtocolModel { config }
    }

    /// Publishes `source` ([`epochs::publish`], the shipped rule); whether anything changed.
    pub(super) fn publish(&self, s: &mut State, source: Status) -> bool {
        let current = s.published.map(|p| {
            (
                Some(JOBSET_UID),
                Epochs {
                    deprecated: p.deprecated,
                    synced: p.synced,
                    bypass: false,
                    watch_job_set: false,
                },
            )
        });
        let source = epochs::Source {
            uid: JOBSET_UID,
            status: source.epochs(),
            bypass: false,
            delegate: false,
        };
        let Some(next) = epochs::publish(current, &source) else {
            return false;
        };
        let below = |n: Option<Epoch>, b: Option<Epoch>| b.is_some() && n < b;
        if s.published
            .is_some_and(|b| below(next.deprecated, b.deprecated) || below(next.synced, b.synced))
            || next.deprecated > s.released_deprecated
            || next.synced > s.released_synced
        {
            s.violations |= flag::PUBLISHED_WRONG;
        }
        s.published = Some(Status {
            wipes: 0,
            deprecated: next.deprecated,
            synced: next.synced,
        });
        true
    }

    /// What an agent reading now would see: the published object, or the JobSet's status;
    /// `None` while nothing is published (the agent waits on its watch).
    pub(super) fn agents_see(&self, s: &State) -> Option<Status> {
        match self.config.agents_read {
            AgentsRead::Published => s.published,
            AgentsRead::JobSet => Some(s.status),
        }
    }

    pub(super) fn agent_decide(&self, epoch: Epoch, view: Status) -> AgentAction {
        let agent_view = AgentView {
            in_place_restart: true,
            disabled: false,
            status: view.epochs(),
        };
        let action = protocol::agent_decide(epoch, &agent_view);
        match (self.config.variant, action) {
            (Variant::AgentLiftsAtAnySynced, AgentAction::Wait) if view.synced.is_some() => {
                AgentAction::LiftBarrier
            }
            _ => action,
        }
    }

    /// The reconciler's decision on its cache, as `reconcile_input` builds it from the index.
    pub fn reconcile(
        &self,
        view: Status,
        rec: &[RecPod],
        last_synced: Option<Epoch>,
        last_deprecated: Option<Epoch>,
    ) -> protocol::ReconcileDecision {
        let pods: Vec<PodView> = rec
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                r.seen.map(|s| PodView {
                    name: pod_name(i),
                    uid: pod_name(i),
                    failed: s.failed,
                    terminating: false,
                    epoch_annotation: s.annotation.map(|e| e.to_string()),
                    max_restart_count: 0,
                    counted_in_last_sync: r.counted,
                    restart_begun: r.begun,
                    ..PodView::default()
                })
            })
            .collect();
        let expected = match self.config.variant {
            Variant::ReconcilerSyncsEarly => 1,
            _ => i64::from(self.config.pods),
        };
        let input = ReconcileInput {
            dialect: self.config.dialect,
            expected_pods: expected,
            max_restarts: i32::MAX,
            status: view.epochs(),
            restarts: 0,
            restarts_count_towards_max: 0,
            last_synced: match self.config.variant {
                Variant::ReconcilerWithoutMemory => None,
                _ => last_synced,
            },
            last_deprecated: match self.config.variant {
                Variant::ReconcilerWithoutMemory => None,
                _ => last_deprecated,
            },
            pods: &pods,
        };
        let mut decision = protocol::reconcile_decide(&input);
        assert!(decision.fail.is_none(), "maxRestarts is out of reach");
        if self.config.variant == Variant::ReconcilerNeverDeprecates {
            decision.change.deprecated = None;
        }
        decision
    }

    /// A pod restarts or fails: record the generation it ends (the highest epoch a worker runs
    /// or may start at: running workers', lifted agents', the highest synced epoch written, as
    /// a stale watch event may still lift a barrier at it) before the failure counts.
    pub(super) fn fail(state: &mut State) {
        let lifted = state
            .pods
            .iter()
            .filter(|p| !p.failed)
            .filter_map(|p| match p.agent {
                Agent::Watching {
                    epoch,
                    lifted: true,
                    ..
                } => Some(epoch),
                _ => p.worker,
            });
        let generation = lifted.chain(state.released_synced).max();
        state.generations.push(generation);
        state.failures_left -= 1;
    }

    /// Failures so far.
    pub(super) fn failures(state: &State) -> u8 {
        u8::try_from(state.generations.len()).unwrap_or(u8::MAX)
    }

    /// The worker of `p` (running at `epoch`) belongs to a generation that a failure after its
    /// agent started ended: the failure with index `k` for the first such `k`.
    pub fn doomed_by(state: &State, p: &Pod, epoch: Epoch) -> Option<usize> {
        state
            .generations
            .iter()
            .enumerate()
            .skip(usize::from(p.born))
            .find(|(_, g)| g.is_some_and(|g| epoch <= g))
            .map(|(k, _)| k)
    }

    /// The successor of `state` by `action`, or `None` when the action is not enabled or would
    /// change nothing.
    pub fn step(&self, state: &State, action: Action) -> Option<State> {
        let cfg = &self.config;
        let mut s = state.clone();
        match action {
            Action::AgentReads(i) | Action::AgentReadsStale(i) => {
                let read = match action {
                    Action::AgentReadsStale(_) => s.agents_before?,
                    _ => self.agents_see(&s)?,
                };
                let p = s.pods.get_mut(i)?;
                if p.failed || p.agent != Agent::Starting {
                    return None;
                }
                let epoch = protocol::agent_epoch(cfg.dialect, p.annotation, read.synced);
                p.agent = Agent::Registering { epoch, read };
            }
            Action::AgentRegisters(i) => {
                let p = s.pods.get_mut(i)?;
                let Agent::Registering { epoch, read } = p.agent else {
                    return None;
                };
                if p.annotation.is_some_and(|a| a > epoch) {
                    if !cfg.admission_policy {
                        s.violations |= flag::EPOCH_DECREASED;
                    } else if cfg.variant == Variant::AgentRetriesRefusedEpoch {
                        // Refused (422), and retried with the same epoch: no step changes anything.
                        return None;
                    } else {
                        // Refused (422): the agent reads its pod and JobSet again.
                        p.agent = Agent::Starting;
                        return self.finish(state, s, action);
                    }
                }
                p.annotation = Some(epoch);
                p.agent = Agent::Watching {
                    epoch,
                    view: read,
                    decided: false,
                    lifted: false,
                };
            }
            Action::AgentWatchDelivers(i) => {
                let status = self.agents_see(&s)?;
                let p = s.pods.get_mut(i)?;
                let Agent::Watching { view, decided, .. } = &mut p.agent else {
                    return None;
                };
                if *view == status {
                    return None;
                }
                *view = status;
                *decided = false;
            }
            Action::AgentDecides(i) => {
                let p = s.pods.get(i)?;
                let Agent::Watching {
                    epoch,
                    view,
                    decided: false,
                    lifted,
                } = p.agent
                else {
                    return None;
                };
                let next = match self.agent_decide(epoch, view) {
                    AgentAction::Restart(_) => {
                        if s.released_deprecated.is_none_or(|d| epoch > d) {
                            s.violations |= flag::EXIT_NOT_DEPRECATED;
                        }
                        Agent::Exited
                    }
                    AgentAction::LiftBarrier => Agent::Watching {
                        epoch,
                        view,
                        decided: true,
                        lifted: true,
                    },
                    AgentAction::Wait => Agent::Watching {
                        epoch,
                        view,
                        decided: true,
                        lifted,
                    },
                };
                s.pods[i].agent = next;
            }
            Action::KubeletStartsWorker(i) => {
                let p = s.pods.get_mut(i)?;
                let Agent::Watching {
                    epoch,
                    lifted: true,
                    ..
                } = p.agent
                else {
                    return None;
                };
                if p.worker.is_some() {
                    return None;
                }
                p.worker = Some(epoch);
            }
            Action::KubeletRestartsPod(i) => {
                let p = s.pods.get_mut(i)?;
                if p.failed || p.agent != Agent::Exited {
                    return None;
                }
                p.worker = None;
                p.agent = Agent::Starting;
                p.born = u8::try_from(state.generations.len()).unwrap_or(u8::MAX);
            }
            Action::KubeletWritesCondition(i) => {
                let p = s.pods.get_mut(i)?;
                if !cfg.kubelet_condition || p.failed || p.restarting == p.kubelet_restarting() {
                    return None;
                }
                p.restarting = p.kubelet_restarting();
            }
            Action::LateRegistrationLands(i) => {
                let p = s.pods.get_mut(i)?;
                let epoch = p.late.take()?;
                if p.annotation.is_some_and(|a| a > epoch) {
                    if cfg.admission_policy {
                        // Refused (422); nobody waits for the answer.
                        return self.finish(state, s, action);
                    }
                    s.violations |= flag::EPOCH_DECREASED;
                }
                p.annotation = Some(epoch);
            }
            Action::JobControllerReplaces(i) => {
                let p = s.pods.get_mut(i)?;
                if !p.failed || p.replaced {
                    return None;
                }
                p.replaced = true;
                let mut fresh = Pod::new();
                fresh.born = Self::failures(&s);
                s.pods.push(fresh);
                s.rec_pods.push(RecPod::default());
            }
            Action::ReconcilerSeesJobSet => {
                if s.rec_status == Some(s.status) {
                    return None;
                }
                s.rec_status = Some(s.status);
            }
            Action::ReconcilerPublishes => {
                if cfg.agents_read != AgentsRead::Published {
                    return None;
                }
                let view = s.rec_status?;
                if !self.publish(&mut s, view) {
                    return None;
                }
            }
            Action::ReconcilerPodWatchDelivers => {
                if s.rec_queue.is_empty() {
                    return None;
                }
                let (i, seen) = s.rec_queue.remove(0);
                s.rec_pods[usize::from(i)].observe(usize::from(i), seen, cfg.variant);
            }
            Action::ReconcilerRelistsPods => {
                let current: Vec<Option<Seen>> = s.pods.iter().map(|p| Some(Seen::of(p))).collect();
                if s.rec_queue.is_empty()
                    && s.rec_pods
                        .iter()
                        .map(|r| r.seen)
                        .eq(current.iter().copied())
                {
                    return None;
                }
                s.rec_queue.clear();
                for (i, (r, c)) in s.rec_pods.iter_mut().zip(current).enumerate() {
                    if let Some(c) = c {
                        r.observe(i, c, cfg.variant);
                    }
                }
            }
            Action::ReconcilerRelistsPod(i) => {
                if cfg.variant != Variant::ReconcilerDecidesMidRelist {
                    return None;
                }
                let seen = Seen::of(s.pods.get(i)?);
                if s.rec_pods[i].seen == Some(seen) {
                    return None;
                }
                s.rec_pods[i].observe(i, seen, cfg.variant);
                s.rec_queue.retain(|(j, _)| usize::from(*j) != i);
            }
            Action::ReconcilerDecides => {
                let view = s.rec_status?;
                let decision =
                    self.reconcile(view, &s.rec_pods, s.rec_last_synced, s.rec_last_deprecated);
                let change = decision.change;
                if change.is_empty() {
                    return None;
                }
                if change.deprecated.is_some_and(|d| {
                    i64::from(d) >= i64::from(cfg.first()) + i64::from(Self::failures(&s))
                }) {
                    s.violations |= flag::DEPRECATED_WITHOUT_FAILURE;
                }
                if cfg.agents_read == AgentsRead::Published {
                    // The decision is published first, then written to the status (guarded):
                    // the published epochs never lag the status (a new pod reading them never
                    // reads a synced epoch older than the status's).
                    let decided = Status {
                        wipes: 0,
                        deprecated: change.deprecated.or(view.deprecated),
                        synced: change.synced.or(view.synced),
                    };
                    s.released_deprecated = s.released_deprecated.max(decided.deprecated);
                    s.released_synced = s.released_synced.max(decided.synced);
                    self.publish(&mut s, decided);
                }
                if view != s.status {
                    // 409: re-read the JobSet; decide again on the next step.
                    s.rec_status = Some(s.status);
                } else {
                    let mut next = s.status;
                    if let Some(d) = change.deprecated {
                        if next.deprecated.is_some_and(|cur| d < cur) {
                            s.violations |= flag::WRITE_LOWERED;
                        }
                        if s.written_deprecated.is_some_and(|w| d < w) {
                            s.violations |= flag::WRITE_BELOW_EARLIER;
                        }
                        next.deprecated = Some(d);
                        s.written_deprecated = s.written_deprecated.max(Some(d));
                        s.released_deprecated = s.released_deprecated.max(Some(d));
                        s.rec_last_deprecated = s.rec_last_deprecated.max(Some(d));
                    }
                    if let Some(e) = change.synced {
                        if next.synced.is_some_and(|cur| e < cur) {
                            s.violations |= flag::WRITE_LOWERED;
                        }
                        if s.written_synced.is_some_and(|w| e < w) {
                            s.violations |= flag::WRITE_BELOW_EARLIER;
                        }
                        next.synced = Some(e);
                        s.written_synced = s.written_synced.max(Some(e));
                        s.released_synced = s.released_synced.max(Some(e));
                        s.rec_last_synced = Some(e);
                        for (i, r) in s.rec_pods.iter_mut().enumerate() {
                            r.counted = decision.synced_pods.contains(&pod_name(i));
                        }
                    }
                    s.status = next;
                    s.rec_status = Some(next);
                }
            }
            Action::WorkerCrashes(pod) => {
                if s.failures_left == 0 {
                    return None;
                }
                let p = s.pods.get(pod)?;
                if p.failed || p.worker.is_none() || !p.agent_alive() {
                    return None;
                }
                Self::fail(&mut s);
                let p = &mut s.pods[pod];
                p.worker = None;
                p.agent = Agent::Exited;
            }
            Action::AgentCrashes { pod, late } => {
                if s.failures_left == 0 {
                    return None;
                }
                let p = s.pods.get(pod)?;
                if p.failed || !p.agent_alive() {
                    return None;
                }
                let in_flight = match (late, p.agent) {
                    (false, _) => None,
                    (true, Agent::Registering { epoch, .. }) => Some(epoch),
                    (true, _) => return None,
                };
                Self::fail(&mut s);
                let p = &mut s.pods[pod];
                p.late = in_flight;
                p.agent = Agent::Exited;
            }
            Action::NodeLost(pod) => {
                if s.failures_left == 0 || !cfg.node_loss {
                    return None;
                }
                if s.pods.get(pod)?.failed {
                    return None;
                }
                Self::fail(&mut s);
                let p = &mut s.pods[pod];
                // A failed pod is ignored by everyone: keep nothing that could tell two failed
                // pods apart.
                *p = Pod {
                    annotation: None,
                    failed: true,
                    replaced: false,
                    agent: Agent::Gone,
                    worker: None,
                    born: 0,
                    late: None,
                    restarting: false,
                };
            }
            Action::StatusWiped => {
                if s.wipes_left == 0 || (s.status.deprecated.is_none() && s.status.synced.is_none())
                {
                    return None;
                }
                s.wipes_left -= 1;
                s.status = Status {
                    wipes: s.status.wipes + 1,
                    deprecated: None,
                    synced: None,
                };
            }
            Action::ReconcilerRestarts => {
                if s.rec_restarts_left == 0 {
                    return None;
                }
                s.rec_restarts_left -= 1;
                s.rec_status = None;
                s.rec_last_synced = None;
                s.rec_last_deprecated = None;
                s.rec_queue.clear();
                s.rec_pods.iter_mut().for_each(|p| *p = RecPod::default());
            }
        }
        self.finish(state, s, action)
    }

    /// The checks every step ends with.
    pub(super) fn finish(&self, state: &State, mut s: State, action: Action) -> Option<State> {
        let cfg = &self.config;
        // Every change of a pod is an event of the reconciler's pod watch.
        for (i, p) in s.pods.iter().enumerate() {
            let now = Seen::of(p);
            if state.pods.get(i).map(Seen::of) != Some(now) {
                s.rec_queue.push((u8::try_from(i).unwrap_or(u8::MAX), now));
            }
        }
        // A lagging watch cache holds the agents' source as it was before its last change.
        if cfg.first_read == FirstRead::Stale {
            let (before, now) = (self.agents_see(state), self.agents_see(&s));
            if before != now {
                s.agents_before = before;
            }
        }
        // What the reconciler remembers of a failed pod does not matter any more.
        for (p, r) in s.pods.iter().zip(s.rec_pods.iter_mut()) {
            if p.failed {
                r.counted = false;
            }
        }
        let limit = cfg.epoch_limit();
        let over = |e: Option<Epoch>| e.is_some_and(|e| e > limit);
        if over(s.status.deprecated)
            || over(s.status.synced)
            || s.pods.iter().any(|p| over(p.annotation))
        {
            s.violations |= flag::EPOCH_UNBOUNDED;
        }
        if !action.is_fault() && !self.progressed(state, &s) {
            s.violations |= flag::NO_PROGRESS;
        }
        (s != *state).then_some(s)
    }

    /// The progress order: the product of the status, the reconciler's views and every pod
    /// object's own order (objects are only ever added). Every step that is not a fault must
    /// move it strictly up; as it is a partial order, no cycle of such steps exists, so once the
    /// fault budgets are spent every run ends in a state where nothing but a fault is enabled.
    pub fn progressed(&self, before: &State, after: &State) -> bool {
        let first = self.config.first();
        // The system itself: the status and the pods (objects are only added).
        let system = || {
            product(
                [
                    before.status.progress(after.status),
                    match (before.published, after.published) {
                        (Some(a), Some(b)) => a.progress(b),
                        (a, b) => Some(a.is_some().cmp(&b.is_some())),
                    },
                    Some(before.pods.len().cmp(&after.pods.len())),
                ]
                .into_iter()
                .chain(
                    before
                        .pods
                        .iter()
                        .zip(&after.pods)
                        .map(|(a, b)| a.progress(b, first)),
                ),
            )
        };
        // The reconciler's views (`counted` only changes with a synced write, which moves the
        // status up).
        let views = || {
            product(
                [match (before.rec_status, after.rec_status) {
                    (Some(a), Some(b)) => a.progress(b),
                    (a, b) => Some(a.is_some().cmp(&b.is_some())),
                }]
                .into_iter()
                .chain(before.rec_pods.iter().zip(&after.rec_pods).map(|(a, b)| {
                    match (a.seen, b.seen) {
                        (Some(x), Some(y)) => x.progress(y),
                        (x, y) => Some(x.is_some().cmp(&y.is_some())),
                    }
                })),
            )
        };
        // Events still to deliver: fewer is further.
        let pending = || Some(after.rec_queue.len().cmp(&before.rec_queue.len()));
        lex([&system, &views, &pending]) == Some(Ordering::Less)
    }

    /// Every action that could be enabled in `state` (the model filters with [`Self::step`]).
    pub(super) fn candidates(&self, state: &State, out: &mut Vec<Action>) {
        for (i, p) in state.pods.iter().enumerate() {
            if p.failed {
                continue;
            }
            match p.agent {
                Agent::Starting => {
                    out.push(Action::AgentReads(i));
                    if self.config.first_read == FirstRead::Stale {
                        out.push(Action::AgentReadsStale(i));
                    }
                }
                Agent::Registering { .. } => out.push(Action::AgentRegisters(i)),
                Agent::Watching { lifted, .. } => {
                    out.push(Action::AgentWatchDelivers(i));
                    out.push(Action::AgentDecides(i));
                    if lifted {
                        out.push(Action::KubeletStartsWorker(i));
                    }
                }
                Agent::Exited => out.push(Action::KubeletRestartsPod(i)),
                Agent::Gone => {}
            }
            if self.config.kubelet_condition {
                out.push(Action::KubeletWritesCondition(i));
            }
            if p.late.is_some() {
                out.push(Action::LateRegistrationLands(i));
            }
        }
        for (i, p) in state.pods.iter().enumerate() {
            if p.failed && !p.replaced {
                out.push(Action::JobControllerReplaces(i));
            }
        }
        out.push(Action::ReconcilerSeesJobSet);
        out.push(Action::ReconcilerPublishes);
        out.push(Action::ReconcilerPodWatchDelivers);
        out.push(Action::ReconcilerRelistsPods);
        if self.config.variant == Variant::ReconcilerDecidesMidRelist {
            for i in 0..state.pods.len() {
                out.push(Action::ReconcilerRelistsPod(i));
            }
        }
        out.push(Action::ReconcilerDecides);
        if state.failures_left > 0 {
            for (i, p) in state.pods.iter().enumerate() {
                if p.failed {
                    continue;
                }
                let late =
                    self.config.late_registrations && matches!(p.agent, Agent::Registering { .. });
                out.push(Action::WorkerCrashes(i));
                out.push(Action::AgentCrashes {
                    pod: i,
                    late: false,
                });
                if late {
                    out.push(Action::AgentCrashes { pod: i, late: true });
                }
                out.push(Action::NodeLost(i));
            }
        }
        out.push(Action::StatusWiped);
        out.push(Action::ReconcilerRestarts);
    }

    /// No step but a fault is enabled.
    pub fn quiescent(&self, state: &State) -> bool {
        let mut actions = Vec::new();
        self.candidates(state, &mut actions);
        actions
            .into_iter()
            .filter(|a| !a.is_fault())
            .all(|a| self.step(state, a).is_none())
    }

    /// The goal: every slot has a live pod, all registered at one epoch `e`, the synced epoch is
    /// `e` and the deprecated epoch below it (present once there was a restart), every barrier
    /// lifted and every worker running at `e`, none owing a restart.
    pub fn converged(&self, state: &State) -> bool {
        let live: Vec<&Pod> = state.pods.iter().filter(|p| !p.failed).collect();
        if live.len() != usize::from(self.config.pods) {
            return false;
        }
        let Some(e) = live.first().and_then(|p| p.annotation) else {
            return false;
        };
        let pods_ok = live.iter().all(|p| {
            p.annotation == Some(e)
                && p.worker == Some(e)
                && Self::doomed_by(state, p, e).is_none()
                && p.late.is_none()
                && matches!(p.agent, Agent::Watching { epoch, lifted: true, .. } if epoch == e)
        });
        let status = state.status;
        pods_ok
            && status.synced == Some(e)
            && status.deprecated.is_none_or(|d| d < e)
            && (e == self.config.first() || status.deprecated.is_some())
    }
}
