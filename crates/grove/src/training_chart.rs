//! `training.png` beside a trained drafter: its loss and held-out tau over the steps.

use std::path::Path;

use anyhow::Result;
use grove_train::trainer::TrainState;
use plotters::prelude::*;

/// Mean of each `window` consecutive losses (the per-step loss is noisy).
fn smoothed(losses: &[(usize, f32)], window: usize) -> Vec<(f64, f64)> {
    losses
        .chunks(window.max(1))
        .map(|chunk| {
            let step = chunk.last().map_or(0, |(s, _)| *s) as f64;
            let mean = chunk.iter().map(|(_, l)| *l as f64).sum::<f64>() / chunk.len() as f64;
            (step, mean)
        })
        .collect()
}

/// Draws the loss (top) and every evaluation metric (bottom) against the step.
pub fn write(state: &TrainState, path: &Path) -> Result<()> {
    crate::bench::register_font()?;
    let root = BitMapBackend::new(path, (900, 640)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(320);
    let steps = state.step.max(1) as f64;
    let loss = smoothed(&state.losses, 20);
    let loss_max = loss.iter().map(|(_, l)| *l).fold(0.0, f64::max) * 1.1;
    let mut chart = ChartBuilder::on(&top)
        .caption("training loss (mean of 20 steps)", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..steps, 0.0..loss_max.max(1e-3))?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("loss")
        .draw()?;
    chart.draw_series(LineSeries::new(loss, BLUE.stroke_width(2)))?;

    let points: Vec<(f64, f64)> = state
        .evaluations
        .iter()
        .map(|(step, _, value)| (*step as f64, *value))
        .collect();
    let y_max = points.iter().map(|(_, v)| *v).fold(1.0, f64::max) * 1.15;
    let name = state
        .evaluations
        .first()
        .map_or("held-out metric", |(_, name, _)| name.as_str());
    let mut chart = ChartBuilder::on(&bottom)
        .caption(name, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..steps, 0.0..y_max)?;
    chart.configure_mesh().x_desc("step").y_desc(name).draw()?;
    chart.draw_series(LineSeries::new(points.clone(), RED.stroke_width(2)))?;
    chart.draw_series(
        points
            .into_iter()
            .map(|point| Circle::new(point, 4, RED.filled())),
    )?;
    root.present()?;
    Ok(())
}
